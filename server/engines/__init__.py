"""Engine adapters behind engine.api.Engine that live outside the native engine (SGLang).

Imported lazily by the launcher; importing this package never imports sglang."""
