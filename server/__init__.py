"""The HTTP front-end: an OpenAI-compatible FastAPI app over any engine.api.Engine.

`create_app` (server/app.py) builds the app; `serve` (server/main.py) runs it under uvicorn for
the launcher (launch/cli.py; `python -m server` is an alias of it, server/__main__.py).
Importing this package imports neither torch models nor uvicorn; import the submodules you need.
"""
