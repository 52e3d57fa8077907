"""`python -m colocate_grpo.serve`: the server for `vllm_mode: server` (see `colocate_grpo.server.app`)."""

from .server.app import main

if __name__ == "__main__":
    main()
