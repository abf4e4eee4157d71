"""The drafter pipeline: prompts -> target-regenerated data -> draft vocab -> online TTT training
-> SGLang/vLLM checkpoint -> accept-length evaluation, plus config inspection.

Depends on models/ and engine/; nothing there depends on this package.
"""
