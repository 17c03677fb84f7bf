"""--download_only against an HTTP server this test starts on 127.0.0.1, serving files it writes."""

import hashlib
import http.server
import socket
import threading

import pytest

from ps_trainer.input import download

pytestmark = pytest.mark.inprocess  # a real HTTP server on loopback, in this process

FILES = {"train-images-idx3-ubyte.gz": bytes(range(256)) * 40, "train-labels-idx1-ubyte.gz": b"labels" * 100,
         "t10k-images-idx3-ubyte.gz": b"images" * 50, "t10k-labels-idx1-ubyte.gz": b"t10k"}
MD5 = {name: hashlib.md5(data).hexdigest() for name, data in FILES.items()}


class Mirror(http.server.ThreadingHTTPServer):
    """Serves `files` at /<name>, honouring 'Range: bytes=N-'; remembers each request's Range."""

    def __init__(self, files):
        self.files, self.ranges = dict(files), []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler):  # noqa: N805
                data = self.files.get(handler.path.lstrip("/"))
                if data is None:
                    handler.send_error(404)
                    return
                wanted = handler.headers.get("Range")
                self.ranges.append(wanted)
                start = int(wanted.split("=")[1].rstrip("-")) if wanted else 0
                handler.send_response(206 if wanted else 200)
                handler.send_header("Content-Length", str(len(data) - start))
                handler.end_headers()
                handler.wfile.write(data[start:])

            def log_message(handler, *args):  # noqa: N805
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"


@pytest.fixture
def mirror():
    servers = []

    def start(files=FILES):
        server = Mirror(files)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/"  # nothing listens there once closed


def test_the_files_come_from_the_first_mirror_that_serves_them_checksums_verified(tmp_path, mirror):
    server = mirror()
    fetched = download.download(str(tmp_path), MD5, (closed_port_url(), server.url), timeout_secs=5)
    assert sorted(fetched) == sorted(FILES)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == FILES
    assert download.download(str(tmp_path), MD5, (server.url,)) == []  # already there: nothing fetched again


def test_a_partial_download_is_resumed(tmp_path, mirror):
    server = mirror()
    name = "train-images-idx3-ubyte.gz"
    (tmp_path / (name + download.PARTIAL)).write_bytes(FILES[name][:3000])
    download.download(str(tmp_path), {name: MD5[name]}, (server.url,))
    assert server.ranges == ["bytes=3000-"]
    assert (tmp_path / name).read_bytes() == FILES[name] and not (tmp_path / (name + download.PARTIAL)).exists()


def test_a_wrong_checksum_or_no_mirror_is_one_error_and_leaves_no_file(tmp_path, mirror):
    bad = mirror({**FILES, "t10k-labels-idx1-ubyte.gz": b"something else"})
    with pytest.raises(download.DownloadError, match=r"cannot download t10k-labels-idx1-ubyte.gz .*MD5 [0-9a-f]{32}, "
                                                     rf"expected {MD5['t10k-labels-idx1-ubyte.gz']}"):
        download.download(str(tmp_path), MD5, (bad.url,))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(FILES) - {"t10k-labels-idx1-ubyte.gz"})
    offline = [closed_port_url(), closed_port_url()]
    with pytest.raises(download.DownloadError, match="Connection refused.*Connection refused"):
        download.download(str(tmp_path / "new"), MD5, offline, timeout_secs=5)
    assert list((tmp_path / "new").iterdir()) == []
