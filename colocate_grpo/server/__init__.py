"""Server mode: the HTTP server around one engine (app.py, `python -m colocate_grpo.serve`), its client
(client.py), the trainer-side Engine over HTTP (remote.py), and the message formats both speak (wire.py)."""
