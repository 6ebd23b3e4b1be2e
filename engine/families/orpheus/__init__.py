"""Provides the Orpheus family (Llama-3.2-3B emitting SNAC 24 kHz codes): grammar and checkpoint reading are pure
(`grammar`, `checkpoint`); the SNAC decoder (`snac`), synthetic checkpoints (`synthetic`) and the measurements
behind docs/orpheus.md (`measure`) import torch.

Nothing is imported here, so `import engine.families.orpheus.grammar` stays free of torch.
"""
