"""No dead code: vulture over the library, the application, the benchmarks, the scripts and the
tests finds no function, class, method or variable that nothing uses.

The tests and benchmarks count as users (a helper only they reach is alive for them), so what
this catches is code nothing reaches at all. Names vulture cannot see used are allowed below,
each with the reason: attributes set on other libraries' objects, the fields of a NamedTuple
read by unpacking, arguments a signature must have, and what pytest calls by name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATHS = ["transformer", "data", "nmt", "bench", "tests", "train.py", "translate.py"]
ALLOWED = {
    # a module's attribute hook (PEP 562): train.py and translate.py import their command's
    # modules only when asked for them
    "__getattr__": "module attribute hook",
    # attributes of CTranslate2's model spec, which its converter reads
    "weight": "ctranslate2 spec", "gamma": "ctranslate2 spec", "beta": "ctranslate2 spec",
    "scale_embeddings": "ctranslate2 spec", "encodings": "ctranslate2 spec",
    "unk_token": "ctranslate2 spec", "bos_token": "ctranslate2 spec",
    "eos_token": "ctranslate2 spec", "decoder_start_token": "ctranslate2 spec",
    "add_source_eos": "ctranslate2 spec",
    # attributes of transformers', torch's, uvicorn's, shlex's, selenium's and Python's objects
    "_attn_implementation": "transformers config", "allow_tf32": "torch backends",
    "should_exit": "uvicorn server", "send_400_response": "uvicorn protocol hook",
    "whitespace_split": "shlex lexer",
    "binary_location": "selenium options", "unraisablehook": "sys",
    "__qualname__": "a function's name, read by JAX",
    # html.parser.HTMLParser's callbacks, which its feed calls
    "handle_starttag": "HTMLParser callback", "handle_endtag": "HTMLParser callback",
    "handle_data": "HTMLParser callback",
    # http.server's request handler hooks and server option, called and read by http.server
    "do_GET": "BaseHTTPRequestHandler method", "do_POST": "BaseHTTPRequestHandler method",
    "log_message": "BaseHTTPRequestHandler method", "daemon_threads": "ThreadingMixIn option",
    # fields of nmt.runtime.files.FileState, compared whole
    "inode": "FileState field", "mtime_ns": "FileState field",
    # orbax's preservation-policy hook, which its CheckpointManager calls (--keep-last)
    "should_preserve": "orbax preservation policy",
    # a signal handler's second argument
    "frame": "signal handler signature",
    # what pytest calls by name
    "pytest_*": "pytest hook", "pytestmark": "pytest marker",
    "_programs_stored_only_where_a_test_asks": "autouse fixture",
}


def test_nothing_is_left_that_nothing_uses():
    import vulture  # the test extra installs it

    result = subprocess.run(
        [sys.executable, "-m", "vulture", *PATHS, "--min-confidence", "60",
         "--ignore-names", ",".join(ALLOWED)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 3), result.stderr  # 3: vulture found dead code
    assert result.stdout == "", (
        f"vulture {vulture.__version__} finds code that nothing uses; remove it, or allow its "
        f"name in {Path(__file__).name} with the reason it is used:\n{result.stdout}")
