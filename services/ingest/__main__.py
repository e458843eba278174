"""`python -m services.ingest`: the gateway with settings from the environment and
./rollstream.toml (the same as `rollstream ingest`)."""

from services.ingest.server import serve
from services.settings import load

if __name__ == "__main__":
    serve(load())
