"""The server's worker without HTTP: one client against 16, in one process, as benchmarks/serve.py's clients ask.

    python benchmarks/serve_worker.py [--shape cpu|wide] [--clients 16] [--requests 10] [--tokens 64]
                                      [--max-batch 16]

A `serving.Worker` decodes a random-weight model of the `cpu` preset's
shape (or `--shape wide`: 6 layers, width 384, context 256), first
compiling what it compiles while idle, before and after ready. Then threads submit requests as
serve.py's clients do (an empty prompt, --tokens new tokens, temperatures
0.6 to 1.2 and top_p 0.9 and 1 by turns), each waiting for its answer
before the next: first one thread, then --clients at once. It reports new
tokens per second of each phase and their ratio: what the continuous
batching gives when no HTTP server and no load generator share the cores.
"""

import argparse
import json
import os
import tempfile
import threading
import time

from helpers import in_threads, make_model, request_body


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["cpu", "wide"], default="cpu")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    args = parser.parse_args()

    import keras

    from gptlite import serving

    with tempfile.TemporaryDirectory() as folder:
        model = keras.saving.load_model(make_model(args.shape, folder))
    settings = serving.ServeSettings(max_batch=args.max_batch, max_queue=4 * args.clients)
    worker = serving.Worker(model, settings)
    worker.warm_up()
    worker.start()
    while worker.compiling or worker.status().get("building", 0):  # what it builds after ready too
        time.sleep(0.1)

    def client(number):
        for request in range(args.requests):
            body = request_body(args.tokens, number * args.requests + request, stream=False)
            completion = serving.parse_completion(body, model, "model", settings)
            done = threading.Event()
            worker.submit(serving.worker.Job(completion.rows, completion,
                                       lambda event: event[0] in ("done", "error", "failure") and done.set()))
            done.wait()

    rates = {clients: clients * args.requests * args.tokens / in_threads(client, clients)
             for clients in (1, args.clients)}
    print(json.dumps({"shape": args.shape, "tokens_per_s": rates, "ratio": rates[args.clients] / rates[1]}))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
