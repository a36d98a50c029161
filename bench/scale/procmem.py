"""A process's memory, as Linux counts it in /proc (standard library only).

status(pid)   VmRSS, RssAnon, RssFile, RssShmem of /proc/PID/status, in bytes
store(pids)   those summed over a store's processes, and the resident
              part of its data area apart: the largest shared mapping
              of each process (the arena a store hands its clients), so
              that what is left (`other`) is what the store keeps about
              its objects besides their bytes
"""

from __future__ import annotations

FIELDS = {"VmRSS": "vm_rss", "RssAnon": "rss_anon", "RssFile": "rss_file", "RssShmem": "rss_shmem"}


def status(pid: int | str) -> dict[str, int]:
    out = dict.fromkeys(FIELDS.values(), 0)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in FIELDS:
                out[FIELDS[key]] = int(line.split()[1]) * 1024
    return out


def largest_shared_mapping(pid: int | str) -> tuple[int, int, str]:
    """(size, resident bytes, name) of the process's largest shared
    mapping; (0, 0, "") if it has none."""
    best = (0, 0, "")
    size = rss = 0
    name = ""
    shared = False

    def done():
        nonlocal best
        if shared and size > best[0]:
            best = (size, rss, name)

    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                done()  # a new mapping: "start-end perms offset dev inode [name]"
                shared = head[1].endswith("s")
                name = head[5].strip() if len(head) > 5 else ""
                size = rss = 0
            elif head[0] == "Size:":
                size = int(head[1]) * 1024
            elif head[0] == "Rss:":
                rss = int(head[1]) * 1024
    done()
    return best


def store(pids: list[int]) -> dict[str, int] | None:
    """The store's memory summed over its processes; None with no process."""
    if not pids:
        return None
    total = dict.fromkeys(FIELDS.values(), 0)
    total["data_rss"] = 0
    for pid in pids:
        for k, v in status(pid).items():
            total[k] += v
        total["data_rss"] += largest_shared_mapping(pid)[1]
    total["other"] = total["vm_rss"] - total["data_rss"]
    return total
