"""Kernel layouts (Marlin, CUTLASS, FlashInfer): pack() / unpack() per layout."""
