"""Model definitions shared by the engine and the drafter pipeline: the Llama-family
target, the EAGLE-3 drafter, their checkpoint formats and the aux-layer conventions."""
