#!/usr/bin/env python3
"""A TCP relay that adds a fixed one-way delay, for the multi-host test's latency variant.

    delay_relay.py --delay_ms=3 LISTEN_IP:PORT=TARGET_IP:PORT ...

Every chunk read is held until delay_ms after it arrived, then written on, in order: latency
without a throughput cap. (This kernel has no sch_netem, so tc cannot add the delay.) Prints the
bytes it relayed when stopped by SIGTERM.
"""

import asyncio
import signal
import sys
import time

relayed = 0


async def pump(reader, writer, delay):
    global relayed
    queue = asyncio.Queue()

    async def read():
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, data))
        queue.put_nowait((0, b""))

    reading = asyncio.ensure_future(read())
    try:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            relayed += len(data)
            await writer.drain()
    finally:
        reading.cancel()
        writer.close()


async def main(delay, routes):
    async def serve(target):
        host, port = target.rsplit(":", 1)

        async def handle(client_reader, client_writer):
            try:
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                client_writer.close()
                return
            await asyncio.gather(pump(client_reader, up_writer, delay), pump(up_reader, client_writer, delay),
                                 return_exceptions=True)
        return handle

    servers = []
    for listen, target in routes:
        host, port = listen.rsplit(":", 1)
        servers.append(await asyncio.start_server(await serve(target), host, int(port)))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("relay ready", flush=True)
    await stop.wait()
    print(f"relayed {relayed} bytes", flush=True)


if __name__ == "__main__":
    delay_ms = float(sys.argv[1].split("=", 1)[1])
    asyncio.run(main(delay_ms / 1000, [arg.split("=", 1) for arg in sys.argv[2:]]))
