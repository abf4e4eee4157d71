"""The HTTP front-end: an OpenAI-compatible FastAPI app over any engine.api.Engine.

`create_app` (server/app.py) builds the app; `serve` and the `python -m server` CLI
(server/main.py) run it under uvicorn. Importing this package imports neither torch models
nor uvicorn; import the submodules you need.
"""
