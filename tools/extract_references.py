"""Extract the public reference implementations that the parity tests run into ``$FASTAR_REFERENCE_DIR``.

Each reference is taken at a fixed commit from a bare mirror or a clone and only its Python and config files
(of one sub-folder, for a repository that holds several projects) are written to ``<dest>/<name>/``, with a
``REFERENCE_COMMIT`` file naming where they came from. Sources: one
``--source NAME=PATH`` per reference, or ``--mirrors DIR`` holding them as ``<owner>+<repo>`` (a mirror's
``repo/`` inside is found) or as ``<repo>`` clones (``git clone https://github.com/<owner>/<repo>``). Nothing
here is committed to this repository: ``tests/test_reference_parity.py`` reads the folder named by
``FASTAR_REFERENCE_DIR`` and skips without it.

    python tools/extract_references.py --mirrors ~/src --dest /tmp/fastar-references
    FASTAR_REFERENCE_DIR=/tmp/fastar-references python -m pytest -q tests/test_reference_parity.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# name -> (GitHub repository, ref to extract, commit the parity figures were measured at[, sub-folder taken])
REFERENCES = {
    "self_forcing": ("guandeh17/Self-Forcing", "main", "33593df3e81fa3ec10239271dd2c100facac6de1"),
    "rolling_forcing": ("TencentARC/RollingForcing", "main", "a1477d09e85dc759a6a6728f55f77f59342ce388"),
    "longlive": ("NVlabs/LongLive", "v1.0", "e52d9ef6865d843282a6b5e9d46d03b35f88929d"),
    "longlive2": ("NVlabs/LongLive", "main", "7860ad9685686bc3edfd407eb4d12579ca47d689"),
    "causvid": ("tianweiy/CausVid", "master", "ca2115039172dfa3a02deee1534408a09680f29f"),
    "causal_forcing": ("thu-ml/Causal-Forcing", "main", "1fc7bbc19a503c1bce80ecef08158b20e702f386"),
    "krea_realtime": ("krea-ai/realtime-video", "main", "acf4b7b4e1a3049a0e04782e751d12203334038d"),
    # The upstream Matrix-Game 2.0 release as the fork carries it (the fork's own changes come later on main);
    # the repository also holds Matrix-Game 1, so only Matrix-Game-2/ is taken, as the folder's root.
    "matrix_game": ("zoheth/Matrix-Game", "main", "8ed02bd612df7dcb9df252a445569359b54f1b30", "Matrix-Game-2"),
    # LingBot-World 2.0's causal-fast release (CC BY-NC-SA 4.0: read and run from outside this repository only).
    "lingbot": ("robbyant/lingbot-world-v2", "main", "2648877f763a06cc743bcd919936da4d25f12e7b"),
}
KEEP_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".jsonl")
# What a reference's tests read beside its code: LingBot-World 2.0's run script and its example camera paths.
EXTRA_SUFFIXES = {"lingbot": (".sh", ".npy")}


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout


def find_git_dir(path: Path) -> Path:
    """A bare mirror is its own git dir; a clone keeps it in .git."""
    if (path / ".git").exists():
        return path / ".git"
    if (path / "HEAD").exists() and (path / "objects").exists():
        return path
    if (path / "repo" / "HEAD").exists():
        return path / "repo"
    raise SystemExit(f"{path} is neither a git clone nor a bare mirror")


def resolve(git_dir: Path, ref: str, pinned: str, use_pinned: bool) -> str:
    for candidate in ([pinned] if use_pinned else []) + [ref, f"origin/{ref}", f"refs/remotes/origin/{ref}"]:
        try:
            return git(git_dir, "rev-parse", "--verify", f"{candidate}^{{commit}}").decode().strip()
        except subprocess.CalledProcessError:
            continue
    raise SystemExit(f"{git_dir}: neither {pinned[:12]} nor {ref} exists")


def extract(name: str, git_dir: Path, commit: str, dest: Path) -> int:
    out = dest / name
    subdir = REFERENCES[name][3] if len(REFERENCES[name]) > 3 else ""
    prefix = f"{subdir}/" if subdir else ""
    if out.exists():
        for p in sorted(out.rglob("*"), reverse=True):
            p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    out.mkdir(parents=True, exist_ok=True)
    # Blob by blob rather than git archive: a mirror may lack its largest files, which are never needed here.
    count, skipped = 0, []
    for line in git(git_dir, "ls-tree", "-r", "-z", commit, *([prefix] if prefix else [])).split(b"\0"):
        if not line:
            continue
        meta, path = line.decode().split("\t", 1)
        mode, kind, blob = meta.split()
        keep = KEEP_SUFFIXES + EXTRA_SUFFIXES.get(name, ())
        if kind != "blob" or mode == "120000" or not path.endswith(keep) or not path.startswith(prefix):
            continue
        try:
            data = git(git_dir, "cat-file", "blob", blob)
        except subprocess.CalledProcessError:
            skipped.append(path)
            continue
        target = out / path[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        count += 1
    if skipped:
        print(f"{name}: {len(skipped)} files absent from the mirror, skipped: {', '.join(skipped[:5])}",
              file=sys.stderr)
    (out / "REFERENCE_COMMIT").write_text(f"{REFERENCES[name][0]} {commit}{' ' + prefix if prefix else ''}\n")
    return count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", default=os.environ.get("FASTAR_REFERENCE_DIR"),
                   help="output folder (default: $FASTAR_REFERENCE_DIR)")
    p.add_argument("--mirrors", help="folder holding the references as <owner>+<repo> mirrors or <repo> clones")
    p.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                   help=f"a mirror or clone for one reference ({', '.join(REFERENCES)})")
    p.add_argument("--latest", action="store_true", help="extract the branch head instead of the pinned commit")
    p.add_argument("only", nargs="*", help="references to extract (default: all)")
    args = p.parse_args(argv)
    if not args.dest:
        p.error("--dest or FASTAR_REFERENCE_DIR is required")
    sources = dict(s.split("=", 1) for s in args.source)
    unknown = set(sources) | set(args.only) - set(REFERENCES)
    if unknown - set(REFERENCES):
        p.error(f"unknown reference(s) {sorted(unknown - set(REFERENCES))}; valid: {', '.join(REFERENCES)}")
    dest = Path(args.dest)
    missing = []
    for name in args.only or REFERENCES:
        repo, ref, pinned = REFERENCES[name][:3]
        if name in sources:
            path = Path(sources[name]).expanduser()
        elif args.mirrors:
            base = Path(args.mirrors).expanduser()
            path = next((c for c in (base / repo.replace("/", "+"), base / repo.split("/")[1]) if c.exists()),
                        base / repo.split("/")[1])
        else:
            missing.append(f"{name}: no source (give --mirrors DIR or --source {name}=PATH)")
            continue
        if not path.exists():
            missing.append(f"{name}: no {path} (clone https://github.com/{repo} and pass --source {name}=PATH)")
            continue
        git_dir = find_git_dir(path)
        commit = resolve(git_dir, ref, pinned, not args.latest)
        n = extract(name, git_dir, commit, dest)
        print(f"{name}: {repo}@{commit[:12]} -> {dest / name} ({n} files)")
    for line in missing:
        print(line, file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
