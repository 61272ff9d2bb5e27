"""The limits a verification service enforces on its clients: frame size, sessions, idle time, rate.

Every limit has a default that a single-GPU service can live with and a `specwire serve`
flag to change it. Hitting a limit refuses one request or one connection, with a message
that says which limit and when to try again; it never stops the service. They live with
the protocol because a client runs into them too (and `specwire`'s parser shows them
without loading the service).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceLimits:
    # A Sync of a 131,072-token history is at most ~640 KiB of msgpack; a 32-token sampled
    # draft ~20 KiB. Larger frames are closed with 1009 before they are decoded.
    max_frame_bytes: int = 1024 * 1024
    # Each session owns a KV cache sized for the whole context (llama.cpp allocates it at
    # once): the session count is what bounds the service's memory.
    max_sessions: int = 32
    idle_timeout_s: float = 300.0  # a session silent this long, both ways, is closed; its client resyncs
    # Requests per second per connection, sustained and in a burst. A client sends one
    # request per round (two after a new turn: Sync, Verify). Target-only decoding (k = 0) of
    # a small model on a GPU makes a few hundred rounds a second: the limit is for floods.
    rate_per_s: float = 1000.0
    rate_burst: int = 1000
    retry_after_s: float = 5.0  # the hint sent with a refused connection (sessions full, loading)
    drain_timeout_s: float = 30.0  # SIGTERM: how long rounds in flight may take to finish
    # Per client (an address; remote_verify/client_gate.py): sessions held (0: half of max_sessions)
    # and new sessions a second. A chat opens one session, and another after a reconnect or a new
    # setting; the burst lets a client open a handful at once, the rate stops a churn.
    max_sessions_per_client: int = 0
    handshake_rate_per_s: float = 10.0
    handshake_burst: int = 20
    limit_loopback: bool = False  # clients on this machine are not limited per client (the chat, benchmarks)

    def problems(self) -> list[str]:
        """Every limit that cannot work, as sentences naming the flag."""
        found = []
        if self.max_frame_bytes < 4096:
            found.append(f"--max-frame-bytes must be at least 4096, got {self.max_frame_bytes}")
        if self.max_sessions < 1:
            found.append(f"--max-sessions must be at least 1, got {self.max_sessions}")
        if not self.idle_timeout_s > 0:
            found.append(f"--idle-timeout must be more than 0 seconds, got {self.idle_timeout_s}")
        if not self.rate_per_s > 0:
            found.append(f"--rate must be more than 0 requests a second, got {self.rate_per_s}")
        if self.rate_burst < 1:
            found.append(f"--rate-burst must be at least 1, got {self.rate_burst}")
        if not self.drain_timeout_s >= 0:
            found.append(f"--drain-timeout must be 0 seconds or more, got {self.drain_timeout_s}")
        if self.max_sessions_per_client < 0:
            found.append(f"--max-sessions-per-client must be 0 (half of --max-sessions) or more, "
                         f"got {self.max_sessions_per_client}")
        if not self.handshake_rate_per_s > 0:
            found.append(f"--handshake-rate must be more than 0 sessions a second, got {self.handshake_rate_per_s}")
        if self.handshake_burst < 1:
            found.append(f"--handshake-burst must be at least 1, got {self.handshake_burst}")
        return found


# Tokens one forward pass may feed for the rounds of several sessions (`specwire serve
# --batch-tokens`; 0: one session a pass). 256 holds a round of each of 32 sessions at k = 4
# (5 tokens each) with room for longer blocks, and bounds how long one shared pass (hence every
# member's round trip) can grow on a CPU, where a pass costs about its tokens.
BATCH_TOKENS = 256
# ... or MEMBER_TOKENS a member, where that is more: a pass of more than 64 members. A budget fixed
# whatever the members left each fewer guesses as they came (one at 128 streams, none at 256), where
# a GPU is least idle: the emulated 70B on 2x H100 at the service level (30 tokens/s a user) served
# 1.40x the users server-only did, and at most 1.63x with any scheduling, by its own cost curve and
# the default pair's acceptance (docs/results.md). Four a member is a chain of three guesses each.
MEMBER_TOKENS = 4
# How much more than the plain pass (the members' own tokens, no guesses) a shared pass that makes a
# reply's first token may cost, by default (`specwire serve --first-token-room`; remote_verify/pass_ledger.py):
# twice it. Here, beside the service's other settings, so that the command line reads it without the service.
FIRST_TOKEN_ROOM = 1.0
# ... and at most this many ms more (`specwire serve --first-token-room-ms`): what guesses may add to the pass
# a person waits on for the first token is a time, not a share. A share alone added a whole plain pass where
# passes are long: 64 ms a pass on the emulated 32B at 32 users (A100), whose first tokens read 1.8x
# server-only's at p99, against 23 ms on the emulated 70B (2x H100), where the room of 1 stays whole.
# Under a closed loop the guesses in the passes a first token waits on also bunch the requests behind them:
# 10 ms kept every profile's aggregate within its spread and took the first token's p99 from 1.62x
# server-only's to 1.38x on the RTX 3090 at 32 users and from 1.53x to 1.27x on the A100 7B at 64, where
# 20 ms read; below it the 70B on 2x H100 loses its aggregate (7 ms: 2.11x against 2.23x; docs/results.md).
FIRST_TOKEN_ROOM_MS = 10.0

# Bounds on the lists of one request that no service setting changes. A service refuses a
# longer list while decoding, from the list's length header, before it builds a single
# element (remote_verify/bounded_messages.py); the lists that grow with the context or the
# draft are bounded by --max-context and --max-draft instead.
MAX_DIST_TOKENS = 1024  # ids in one draft distribution (specwire's drafter sends at most 64)
MAX_STOP_IDS = 256  # stop_ids of one Generate (a chat template has a handful of end tokens)
MAX_DRAFT_SOURCE_CHARS = 16  # a Verify's draft_source names a drafter ("model", "ngram"), not a sentence
# A Draft's tree of guesses (wire/draft_tree.py): SpecEdge sends 32 nodes 4 deep and Sequoia's
# trees reach a few hundred nodes; a pass verifies at most --max-draft of them anyway, so these
# bound only what one frame may make the service read and index.
MAX_TREE_NODES = 256
MAX_TREE_DEPTH = 64
MAX_TREE_WIDTH = 16  # children of one node: a drafter branches where it is unsure among a few tokens
MAX_TOP_LOGPROBS = 20  # most likely tokens a Generated reports beside each token (OpenAI's top_logprobs limit)
MAX_GRAMMAR_BYTES = 64 * 1024  # a Generate's JSON schema: OpenAI caps a strict schema at a few thousand properties
