"""The server's bookkeeping: its clients (discovery, sampling), the mailbox its messages go
through, reply checks, checkpoints and the run record."""
