"""The stand-in model's tokenizer, as a Hugging Face tokenizer directory.

Token ids 0..255 are the raw bytes of the UTF-8 text and 256 is ``<|endoftext|>`` (bos, eos
and pad at once). Clients never talk to the trainer about text: they tokenize themselves, as
with real Tinker, and ``get_tokenizer()`` in the tinker SDK loads whatever directory the
trainer's ``get_info`` names (``model_data.tokenizer_id``). So the directory must load
offline with ``transformers.AutoTokenizer`` and with ``tokenizers.Tokenizer.from_file``, and
both must give the same ids as :func:`encode`.

The vocabulary is a byte-level BPE without merges: the ByteLevel pre-tokenizer maps every
byte to one printable character (GPT-2's table) and each such character is one token whose id
is the byte's value.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

EOS = 256
VOCAB_SIZE = 257
EOS_TEXT = "<|endoftext|>"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def encode(text: str) -> list[int]:
    """The text's UTF-8 bytes, one token each (no BOS/EOS added)."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    """Bytes back to text; EOS is dropped and invalid UTF-8 becomes U+FFFD."""
    return bytes(t for t in tokens if t != EOS).decode("utf-8", errors="replace")


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's table, which the ByteLevel pre-tokenizer applies: printable bytes stand for
    # themselves, the others are shifted past U+0100 so that every byte is one visible char.
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def tokenizer_files() -> dict[str, str]:
    """The directory's file contents (deterministic, so racing writers agree byte for byte)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: the whole text is one piece, so no byte is ever merged or dropped.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_TEXT, special=True, normalized=False)])
    if tok.token_to_id(EOS_TEXT) != EOS:
        raise RuntimeError(f"{EOS_TEXT} got id {tok.token_to_id(EOS_TEXT)}, expected {EOS}")
    config = {
        # The generic fast tokenizer: no class-specific BOS insertion or text munging.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TEXT,
        "eos_token": EOS_TEXT,
        "pad_token": EOS_TEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "added_tokens_decoder": {
            str(EOS): {
                "content": EOS_TEXT,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
    }
    special = {"bos_token": EOS_TEXT, "eos_token": EOS_TEXT, "pad_token": EOS_TEXT}
    return {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2, sort_keys=True) + "\n",
    }


def _up_to_date(path: Path, files: dict[str, str]) -> bool:
    try:
        return all(
            (path / name).read_text(encoding="utf-8") == text for name, text in files.items()
        )
    except OSError:
        return False


def write_tokenizer_dir(path: Path) -> Path:
    """Write the tokenizer directory at ``path`` unless it is already there; returns ``path``.

    Safe when several trainer processes race: the directory is built aside and renamed into
    place in one step, so a reader sees either nothing or all three files. A directory that
    exists with other contents (an older format) is rewritten file by file, each file
    replaced atomically.
    """
    path = Path(path)
    files = tokenizer_files()
    if _up_to_date(path, files):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would survive the rename
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        try:
            os.rename(staging, path)
            return path
        except OSError:
            pass  # ``path`` exists: another writer won the race, or it is stale
        if _up_to_date(path, files):
            return path
        path.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.replace(staging / name, path / name)
        return path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
