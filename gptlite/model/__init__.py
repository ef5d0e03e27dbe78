"""The model: its shape (`config`), positions, layers, attention, blocks, and the GPT and Seq2Seq built of them."""
