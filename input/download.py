"""--download_only: MNIST's four IDX files into --data_dir, as mnist_replica's input_data did.

Each file comes from the first mirror that serves it, resumed from a partial download (HTTP Range)
and checked against its MD5 before it takes its name; a file already there with the right checksum
is kept. Nothing half-downloaded ever carries a data file's name.
"""

import hashlib
import os
import urllib.error
import urllib.request

from absl import logging

MIRRORS = ("https://storage.googleapis.com/cvdf-datasets/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/")
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
PARTIAL = ".part"
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A file no mirror could serve whole and with its checksum."""


def download(data_dir: str, files=MNIST_MD5, mirrors=MIRRORS, timeout_secs: float = 30) -> list[str]:
    """Fetches every file missing from data_dir (or whose checksum is wrong); returns those fetched."""
    if "://" in data_dir:
        raise DownloadError(f"--data_dir={data_dir}: --download_only writes to a local directory (or a mount)")
    os.makedirs(data_dir, exist_ok=True)
    fetched = []
    for name, md5 in files.items():
        target = os.path.join(data_dir, name)
        if os.path.exists(target) and _md5(target) == md5:
            logging.info("%s: already there, checksum verified", target)
            continue
        problems = []
        for mirror in mirrors:
            url = mirror + name
            try:
                _fetch(url, target + PARTIAL, timeout_secs)
            except (urllib.error.URLError, OSError) as err:
                problems.append(f"{url}: {getattr(err, 'reason', err)}")
                continue
            actual = _md5(target + PARTIAL)
            if actual == md5:
                os.replace(target + PARTIAL, target)
                logging.info("%s: downloaded from %s, checksum verified", target, url)
                fetched.append(name)
                break
            os.remove(target + PARTIAL)
            problems.append(f"{url}: MD5 {actual}, expected {md5}")
        else:
            raise DownloadError(f"cannot download {name} into {data_dir}: " + "; ".join(problems))
    return fetched


def _fetch(url: str, partial: str, timeout_secs: float) -> None:
    """url -> partial, resuming what partial already holds when the server honours a Range request."""
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_secs)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not have:  # 416: the partial file is whole already
            raise
        return
    with response, open(partial, "ab" if response.status == 206 else "wb") as out:
        if have and response.status == 206:
            logging.info("%s: resuming after %d bytes", url, have)
        while chunk := response.read(CHUNK):
            out.write(chunk)


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
