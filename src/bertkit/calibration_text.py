"""The built-in calibration text for int8 inference: 64 English sentences written for bertkit (so they ship under
its licence), mixing what BERT models are used on: reviews, news, captions, questions, instructions, dialogue,
science, finance, sport, narration. ``quantize_int8`` measures each projection input's largest activation on them
when a user gives no texts of their own; fixed text makes a quantized model the same on every call and machine. On
MiniLM these 64 gave the min cosine to fp32 that 256 gave (docs/inference.md, section int8).
"""

from __future__ import annotations

CALIBRATION_SENTENCES: tuple[str, ...] = (
    # reviews: films, books, products, places
    "The film is beautifully shot, but the story runs out of ideas halfway through.",
    "The lead actress gives the performance of her career, and the rest of the cast keeps up with her.",
    "The soundtrack alone is worth the price of admission.",
    "The battery lasts two full days, and the screen is bright enough to read in direct sunlight.",
    "Not worth it.",
    "Best pizza I've had outside of Naples!",
    "The sequel keeps everything that made the original charming and adds a sharper, darker edge.",
    "The plot twists are predictable, but the dialogue crackles.",
    # news and reports
    "The city council voted 7 to 2 on Tuesday to expand the bus network into the northern suburbs.",
    "The central bank left interest rates unchanged but signaled that a cut could come later this year.",
    "The new law requires employers with more than 50 workers to publish their pay gaps each year.",
    "Thousands of people gathered in the main square to protest the rise in fuel prices.",
    "A magnitude 6.1 earthquake struck off the coast early Wednesday, but no tsunami warning was issued.",
    "Construction of the new bridge is scheduled to be completed by the end of 2026.",
    "Residents were told to boil their drinking water until further notice.",
    "Prices of fresh vegetables have nearly doubled since the drought began in the spring.",
    # captions and short descriptions
    "A man is riding a bicycle down a busy street.",
    "An old man sits on a bench feeding pigeons.",
    "A cat is sleeping on top of a laptop keyboard.",
    "Someone is peeling a potato.",
    "Two teams are playing soccer in the rain.",
    "A baby is laughing at a puppy.",
    # questions
    "What time does the last train to the airport leave?",
    "Is it safe to eat eggs after the expiration date?",
    "Can you recommend a good book for someone learning to cook?",
    "What does the term 'inflation' actually mean?",
    "What are the symptoms of a vitamin D deficiency?",
    "What is the capital of Australia, and why isn't it Sydney?",
    # instructions and how-to
    "Preheat the oven to 200 degrees and line a baking tray with parchment paper.",
    "Press and hold the power button for ten seconds to restart the device.",
    "Rinse the rice under cold water until the water runs clear.",
    "If the error persists, contact your system administrator.",
    # dialogue, informal, messages
    "Hey, are we still meeting for lunch tomorrow?",
    "Can't wait to see you all next weekend!",
    "Honestly, I think we should just order pizza.",
    "That was the worst customer service experience I've ever had.",
    "Dear Ms. Alvarez, thank you for your application; we would like to invite you to an interview.",
    # science, technology, medicine
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Neural networks learn by adjusting their weights to reduce the error on training examples.",
    "The new battery chemistry stores more energy per kilogram and charges in under fifteen minutes.",
    "Encrypting the data at rest protects it if the disk is stolen.",
    "Sound travels faster in water than in air.",
    "Each model was trained for three epochs with a learning rate of 2e-5.",
    # history, geography, culture
    "The Roman Empire reached its greatest extent under the emperor Trajan.",
    "Paris is the capital of France and its largest city.",
    "Shakespeare's plays have been translated into every major language.",
    "Many of the city's oldest buildings were destroyed in the great fire of 1666.",
    # finance, business, law
    "The contract may be terminated by either party with thirty days' written notice.",
    "Interest on the loan is calculated daily and paid monthly.",
    "The defendant pleaded not guilty to all charges.",
    "The bank charges a fee of 2% on every foreign transaction.",
    # sport
    "The home team scored twice in the last ten minutes to win the match 3-2.",
    "He has won the tournament four times, more than any other player in its history.",
    "Both teams struggled to create chances in a goalless first half.",
    # narration and fiction
    "The old house at the end of the road had been empty for years.",
    "The village woke to find the river frozen solid from bank to bank.",
    "The smell of fresh bread drifted from the bakery on the corner.",
    "It was the kind of summer that seemed as if it would never end.",
    # everyday facts and opinions
    "Most people check their phones within minutes of waking up.",
    "The meeting has been rescheduled to 3:30 p.m. on Wednesday.",
    "The price of a cup of coffee has gone up again.",
    "Children under twelve must be accompanied by an adult.",
    "Social media has changed the way people get their news.",
    "The cost of living in big cities keeps rising faster than wages.",
)

__all__ = ["CALIBRATION_SENTENCES"]
