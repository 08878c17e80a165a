"""Damaging files the way a bad copy, a disk error or a job killed while writing does (test
helper)."""
import os
import struct
import zipfile


def truncate_to_half(path: str) -> None:
    """Cuts ``path`` to half its size (a job killed while the file was written), keeping its
    modification time."""
    stat = os.stat(path)
    with open(path, 'r+b') as f:
        f.truncate(stat.st_size // 2)
    os.utime(path, (stat.st_atime, stat.st_mtime))


def flip_tensor_byte(path: str) -> str:
    """Flips one byte in the middle of the largest tensor record of a ``torch.save`` archive
    (a bad copy or a disk error; the archive stays whole); returns the record's name."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if '/data/' in i.filename),
                   key=lambda i: i.file_size)
    data = bytearray(open(path, 'rb').read())
    # local file header: 30 bytes, then the name and the extra field (lengths at 26 / 28)
    name_len, extra_len = struct.unpack('<HH', data[info.header_offset + 26:
                                                     info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x10
    with open(path, 'wb') as f:
        f.write(data)
    return info.filename
