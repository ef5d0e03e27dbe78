"""Download Tiny Shakespeare (about 1.1 MB) to data/tinyshakespeare.txt.

Usage: python data/download_shakespeare.py [--out PATH]
"""

import argparse
import pathlib
import sys
import urllib.error
import urllib.request

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
EXPECTED_CHARACTERS = 1_115_394


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent / "tinyshakespeare.txt")
    args = parser.parse_args(argv)
    try:
        with urllib.request.urlopen(URL, timeout=30) as response:
            text = response.read().decode("utf-8")
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        print(f"download_shakespeare: error: cannot download {URL} ({reason}); "
              f"are you offline? Copy the file to {args.out} by hand instead.", file=sys.stderr)
        return 1
    if len(text) != EXPECTED_CHARACTERS:
        print(f"download_shakespeare: error: expected {EXPECTED_CHARACTERS:,} characters, "
              f"got {len(text):,}; not saved", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.out.with_suffix(".partial")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(args.out)
    print(f"wrote {args.out} ({len(text):,} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
