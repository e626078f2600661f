"""Where a bench result came from: the git commit (and whether the tree was dirty) that the scripts record."""

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).parent


def git_sha() -> str:
    """The short SHA of the code that ran: $GIT_SHA if set, else `git rev-parse --short HEAD`, else "unknown".

    The environment comes first because the GPU machine runs a copied working tree whose .git may be stale (an
    older HEAD than the files beside it); its runner sets GIT_SHA to the commit it copied. Git runs in bench/, so
    the answer does not depend on the caller's working directory.
    """
    if sha := os.environ.get("GIT_SHA"):
        return sha
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def git_is_dirty() -> bool:
    """Whether tracked files differ from HEAD (untracked ones do not count); False where git cannot tell."""
    cmd = ["git", "status", "--porcelain", "--untracked-files=no"]
    try:
        done = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
    except OSError:
        return False
    return done.returncode == 0 and bool(done.stdout)
