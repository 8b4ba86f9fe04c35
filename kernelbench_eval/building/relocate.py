"""A build carried to another path (another node's cache) loads there without being rebuilt.

Why it would be rebuilt: torch's `load_inline` writes a `build.ninja` naming the sources by absolute path, and
ninja keeps two records about that file: `.ninja_log` (a hash of each output's command line: a changed command
means a rebuild) and `.ninja_deps` (each object's source and headers, by path: a missing one means a rebuild).
Triton's cache names a kernel's files by absolute path too (its `__grp__*.json` files; a missing one means a
recompile). Under a new path every command changes and every recorded source is missing, so the first load
would recompile (needing a compiler on a node that may have none) and alter the build after it was signed.

What `relocate` does, under the build's lock and before the build is signed for this node (`signed.adopt`):
replaces the old build path by the new one in `build.ninja` and in Triton's group files, rewrites the path
records of `.ninja_deps` (format v4), and recomputes each `.ninja_log` entry's hash for its rewritten command
(as `ninja -t commands -s OUTPUT` prints it) with ninja's hash for that log version (MurmurHash64A for v5
and v6, rapidhash for v7; both written here from their published definitions). Anything it does not
recognise is left alone: that build then rebuilds once, as it did before, slower but never wrong.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

_MASK = (1 << 64) - 1
_DEPS_HEADER = b"# ninjadeps\n"
_LOG_HEADER = re.compile(rb"# ninja log v(\d+)\n")
_UNSAFE = re.compile(r"[\s$:]")  # a path ninja would need escaped: not rewritten as plain text


def relocate(build: Path, old: Path) -> bool:
    """Make the build at `build`, made at `old`, load here as it did there; False when `old` is `build`."""
    if str(old) == str(build) or _UNSAFE.search(str(old)) or _UNSAFE.search(str(build)):
        return False
    old_prefix, new_prefix = f"{old}/", f"{build}/"
    for ninja_file in sorted((build / "ext").glob("*/build.ninja")):
        folder = ninja_file.parent
        text = ninja_file.read_text()
        ninja_file.write_text(text.replace(old_prefix, new_prefix))
        _rewrite_deps(folder / ".ninja_deps", old_prefix.encode(), new_prefix.encode())
        _rehash_log(folder)
    rewrite_triton(build / "triton", old / "triton", build / "triton")
    return True


def rewrite_triton(cache: Path, old: Path, new: Path) -> None:
    """Triton's group files under `cache` name their members under `new` instead of `old`."""
    old_prefix = f"{old}/"
    for group in cache.rglob("__grp__*") if cache.is_dir() else []:
        try:
            data = json.loads(group.read_text())
            children = data["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a group file Triton would use either
        if isinstance(children, dict):
            data["child_paths"] = {name: f"{new}/{path[len(old_prefix):]}" if path.startswith(old_prefix) else path
                                   for name, path in children.items()}
            group.write_text(json.dumps(data))


def _rewrite_deps(path: Path, old: bytes, new: bytes) -> None:
    """`.ninja_deps` v4: a header, then records of a 4-byte size (top bit: a deps record); a path record is the
    path, NUL-padded to 4 bytes, then a 4-byte checksum of its node id, which a new path keeps."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    if not data.startswith(_DEPS_HEADER) or data[12:16] != struct.pack("<i", 4):
        return
    out, pos = bytearray(data[:16]), 16
    while pos + 4 <= len(data):
        (field,) = struct.unpack_from("<I", data, pos)
        size = field & 0x7FFFFFFF
        record = data[pos + 4: pos + 4 + size]
        if len(record) < size or size < 4:
            break  # a torn last record, which ninja itself drops
        if field >> 31:
            out += data[pos: pos + 4 + size]
        else:
            name = record[:-4].rstrip(b"\0")
            if name.startswith(old):
                name = new + name[len(old):]
            body = name + b"\0" * (-len(name) % 4) + record[-4:]
            out += struct.pack("<I", len(body)) + body
        pos += 4 + size
    path.write_bytes(bytes(out))


def _rehash_log(folder: Path) -> None:
    """Each `.ninja_log` entry's command hash, recomputed for the command `build.ninja` now gives its output."""
    log = folder / ".ninja_log"
    try:
        data = log.read_bytes()
    except OSError:
        return
    header = _LOG_HEADER.match(data)
    hasher = LOG_HASHES.get(int(header.group(1))) if header else None
    if hasher is None:
        return
    lines = data[header.end():].decode(errors="surrogateescape").splitlines()
    rewritten = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) == 5:
            command = _command(folder, fields[3])
            if command is not None:
                fields[4] = f"{hasher(command):x}"
        rewritten.append("\t".join(fields))
    log.write_bytes(header.group(0) + "".join(f"{line}\n" for line in rewritten).encode(errors="surrogateescape"))


def _command(folder: Path, output: str) -> bytes | None:
    """The command that builds `output`, exactly as ninja evaluates (and hashes) it."""
    try:
        proc = subprocess.run(["ninja", "-C", str(folder), "-t", "commands", "-s", output], capture_output=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.split(b"\n")
    return lines[0] if proc.returncode == 0 and len(lines) == 2 and not lines[1] else None


def murmur64a(data: bytes) -> int:
    """64-bit MurmurHash2 (MurmurHash64A) with ninja's seed: its command hash up to log v6."""
    m, seed = 0xC6A4A7935BD1E995, 0xDECAFBADDECAFBAD
    h = (seed ^ (len(data) * m)) & _MASK
    whole = len(data) - len(data) % 8
    for i in range(0, whole, 8):
        k = int.from_bytes(data[i: i + 8], "little") * m & _MASK
        k = (k ^ (k >> 47)) * m & _MASK
        h = (h ^ k) * m & _MASK
    if whole < len(data):
        h = (h ^ int.from_bytes(data[whole:], "little")) * m & _MASK
    h = (h ^ (h >> 47)) * m & _MASK
    return h ^ (h >> 47)


_RAPID_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def _mum(a: int, b: int) -> tuple[int, int]:
    product = a * b
    return product & _MASK, product >> 64


def _mix(a: int, b: int) -> int:
    low, high = _mum(a, b)
    return low ^ high


def rapidhash(data: bytes, seed: int = 0xBDD89AA982704029) -> int:
    """rapidhash (v1, the variant ninja vendors) with its default seed: ninja's command hash from log v7."""
    s0, s1, s2 = _RAPID_SECRET
    n = len(data)

    def r64(at: int) -> int:
        return int.from_bytes(data[at: at + 8], "little")

    def r32(at: int) -> int:
        return int.from_bytes(data[at: at + 4], "little")

    seed ^= _mix(seed ^ s0, s1) ^ n
    if n <= 16:
        if n >= 4:
            delta = (n & 24) >> (n >> 3)
            a = (r32(0) << 32) | r32(n - 4)
            b = (r32(delta) << 32) | r32(n - 4 - delta)
        elif n:
            a, b = (data[0] << 56) | (data[n >> 1] << 32) | data[n - 1], 0
        else:
            a = b = 0
    else:
        p, left = 0, n
        if left > 48:
            see1 = see2 = seed
            while left >= 48:
                seed = _mix(r64(p) ^ s0, r64(p + 8) ^ seed)
                see1 = _mix(r64(p + 16) ^ s1, r64(p + 24) ^ see1)
                see2 = _mix(r64(p + 32) ^ s2, r64(p + 40) ^ see2)
                p, left = p + 48, left - 48
            seed ^= see1 ^ see2
        if left > 16:
            seed = _mix(r64(p) ^ s2, r64(p + 8) ^ seed ^ s1)
            if left > 32:
                seed = _mix(r64(p + 16) ^ s2, r64(p + 24) ^ seed)
        a, b = r64(p + left - 16), r64(p + left - 8)
    a, b = _mum(a ^ s1, b ^ seed)
    return _mix(a ^ s0 ^ n, b ^ s1)


LOG_HASHES = {5: murmur64a, 6: murmur64a, 7: rapidhash}  # ninja log version -> its command hash
