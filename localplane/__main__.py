"""``python -m localplane`` — the same as ``shepherd plane``."""

from shepherd.cli.main import app

if __name__ == "__main__":
    app(["plane", *__import__("sys").argv[1:]])
