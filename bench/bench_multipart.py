"""The multipart parser's cost per MB: werkzeug's sans-IO decoder (as web/views/upload.py drives it, 256 KiB
slices) against streaming-form-data (C-accelerated), on one 46-file body of camera-sized random parts.

    python bench/bench_multipart.py   # needs `pip install streaming-form-data`; not a dependency

Prints CPU MB/s (``time.process_time``, best of 3) for each. Issue 18 asks to adopt streaming-form-data only
if a profile of the real server says multipart parsing is a significant share of its time.
"""

from __future__ import annotations

import os
import time

from werkzeug.sansio.multipart import NEED_DATA, Data, MultipartDecoder

BOUNDARY = "----bench-multipart-1d2e"
SLICE = 256 * 1024
FILES, FILE_BYTES = 46, 11 * 1024 * 1024


def body() -> bytes:
    block = os.urandom(FILE_BYTES)
    parts = [f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"{i}.jpg\"\r\n"
             f"Content-Type: image/jpeg\r\n\r\n".encode() + block + b"\r\n" for i in range(FILES)]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def werkzeug(data: bytes) -> int:
    decoder, got, view = MultipartDecoder(BOUNDARY.encode(), max_form_memory_size=4 * SLICE), 0, memoryview(data)
    for start in [*range(0, len(view), SLICE), None]:
        decoder.receive_data(None if start is None else view[start:start + SLICE])  # type: ignore[arg-type]
        while (event := decoder.next_event()) is not NEED_DATA:
            if isinstance(event, Data):
                got += len(event.data)
            if start is None and event.__class__.__name__ == "Epilogue":
                break
        if start is None:
            break
    return got


def streaming_form_data(data: bytes) -> int:
    from streaming_form_data import StreamingFormDataParser
    from streaming_form_data.targets import BaseTarget

    class Count(BaseTarget):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def on_data_received(self, chunk: bytes) -> None:
            self.n += len(chunk)

    parser = StreamingFormDataParser(headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    target = Count()
    parser.register("photos", target)
    view = memoryview(data)
    for start in range(0, len(view), SLICE):
        parser.data_received(bytes(view[start:start + SLICE]))
    return target.n


def main() -> None:
    data = body()
    for fn in (werkzeug, streaming_form_data):
        best = float("inf")
        for _ in range(3):
            t = time.process_time()
            got = fn(data)
            best = min(best, time.process_time() - t)
        print(f"{fn.__name__}: {len(data) / 1e6 / best:.0f} MB/s of CPU ({got / 1e6:.0f} MB of file data, "
              f"{best:.3f} s for {len(data) / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
