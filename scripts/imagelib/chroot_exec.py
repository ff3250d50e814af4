"""Runs one command of an exported image root, as an engine would: mounts /proc and /dev into the root, chroots,
enters the image's workdir as its user and execs the command with the image's environment (PATH from it).

    unshare --mount --propagation private -- python3 chroot_exec.py '<json spec>'

Run under a private mount namespace, so the mounts end with the command. Stdlib only: it runs on the host's Python
until the exec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    root = spec["root"]
    for target, mount in (("proc", ["-t", "proc", "proc"]), ("dev", ["--rbind", "/dev"])):
        os.makedirs(os.path.join(root, target), exist_ok=True)
        subprocess.run(["mount", *mount, os.path.join(root, target)], check=True)
    os.chroot(root)
    os.chdir(spec["workdir"])
    os.setgroups([spec["gid"]])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])  # the same pid: signals reach the command


if __name__ == "__main__":
    main()
