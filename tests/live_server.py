"""A real uvicorn server on 127.0.0.1 (a free port) in a thread, for the HTTP server's tests."""

import threading
import time

import uvicorn


class Live:
    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        assert host == "127.0.0.1"
        self.url = f"http://{host}:{port}"

    def stop(self):
        """Like SIGTERM: stop accepting, finish what is in flight, end the thread."""
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def untrained_model(like, out, src_lang: str, tgt_lang: str, seed: int = 7):
    """A randomly initialised model directory of ``like``'s shape and vocabulary, for a second pair.

    Its translations are junk but deterministic and differ from ``like``'s, so a request routed to
    the wrong model is caught."""
    import torch

    from transduce.model import Transformer
    from transduce.modeldir import load_model_dir, save_model_dir

    model, vocabs, _ = load_model_dir(like)
    torch.manual_seed(seed)
    return save_model_dir(out, Transformer(model.config).eval(), vocabs, {"src_lang": src_lang, "tgt_lang": tgt_lang})
