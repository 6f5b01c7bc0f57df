"""What the tests read back from a written reproducer's files."""

from pathlib import Path


def input_manifest(d: Path) -> dict[str, dict[str, str]]:
    """inputs.txt's tensor lines, by name: each line's key=value fields."""
    out = {}
    for line in (Path(d) / "inputs.txt").read_text().splitlines():
        if line.startswith("tensor "):
            kv = dict(t.split("=", 1) for t in line.split()[1:])
            out[kv["name"]] = kv
    return out
