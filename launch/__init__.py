"""Launch profiles and the `specserve` entry point (launch/serve.sh wraps launch.cli)."""
