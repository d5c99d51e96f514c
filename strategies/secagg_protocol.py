"""SecAgg+ (Bell et al., CCS 2020; SecAgg: Bonawitz et al., CCS 2017) as pure functions.

Each stage is a function from a state and the messages of the stage to the next state and the
messages to send (as TF Privacy's DPQuery): no Flower, no I/O. The wiring into the Flower apps
turns the frozen dataclasses below into records. Cryptographic primitives are Flower's (ECDH +
HKDF, Fernet, Shamir over GF(2¹²⁸), PEM key serialisation); the masks are
:func:`fairclip.strategies.secure_sum.mask_stream` (AES-256-CTR keyed by the full 32-byte secret),
not Flower's PRG; the vectors are :class:`fairclip.strategies.secure_sum.Layout`'s quantised ones.

Stages (U0 ⊇ U1 ⊇ U2 ⊇ U3 ⊇ U4, the nodes still in at each stage)::

    0 setup       server → u: config, neighbours N(u)     u → server: pk1_u, pk2_u (fresh each exchange)
    1 share keys  server → u: keys of N(u) ∩ U1           u → server: Enc(KA(sk2_u, pk2_v), shares of
                                                           b_u and sk1_u) for each v, and H(b_u)
    2 masked      server → u: ciphertexts to u            u → server: y_u = x_u + PRG(b_u)
                                                           + Σ_v ±PRG(KA(sk1_u, pk1_v)) mod M
    3 unmask      server → u: alive and dead neighbours   u → server: b shares of the alive,
                                                           sk1 shares of the dead

A node that misses stage 0 or 1 is left out (no one has masked with it yet); a node whose shares
fewer than t nodes of U2 hold is left out too, before anyone masks. After stage 2 the server
needs t shares for every node of U3 (its b_u) and of U2 − U3 (its sk1_u); when any are missing,
fewer than t nodes survive, or a reconstruction fails (a share that does not combine, a b_u that
does not match its hash, an sk1 that does not match its pk1), the round is skipped: the server
functions return :class:`SkippedRound` and never raise on what clients sent. A client raises
:class:`ProtocolAbortError` (the wiring then sends no reply: a dropout) on anything inconsistent: a
stage out of order, fewer than t neighbours, repeated keys, a ciphertext that does not decrypt or
names the wrong nodes, a node listed both alive and dead, a second unmask request.

Neighbourhood: all pairs (SecAgg) by default; a ring of k neighbours over a public hash order of
the nodes (SecAgg+, :func:`neighbourhoods`) where ``num_neighbours`` is given. Keys, b_u and every
pairwise secret are fresh for each exchange, so an exchange's reveals (b_u in one, sk1_u in
another) never unmask the other's vector.

**Threat model** (design memo, section 5).

* *Semi-honest server*, as Flower's: it follows the protocol. There is no consistency round and
  client keys are not authenticated, so a malicious server could list u alive to some nodes and
  dead to others (a client refuses only a list naming one node both ways) or relay its own keys.
  With t above half of every neighbourhood (:func:`default_threshold`) the two share sets it
  would need overlap in a node, which answers one unmask request only.
* The server sees the **exact un-noised sum** of the survivors: DP protects the releases made
  from it (noise is added by the server afterwards), not the sum from the server. Distributed
  discrete noise (Kairouz et al. 2021; Agarwal et al. 2021) would be needed for that.
* What the server can still check: each reply's shape, dtype and range (:meth:`Field.is_element`),
  one reply per node, who dropped at each stage; after decoding, that the sum lies in the public
  set. It **folds** each coordinate into the honest range (so a total parked at the field's
  edge cannot wrap with one honest vector) and **projects** onto that set
  (:meth:`Layout.release`); it never decides from the sum.
* A malicious client can send any vector in Z_M^d (poisoning the model up to the projection
  radius), skew counts within [0, n_max], or send bad shares or ciphertexts (the round is then
  skipped or the sender dropped: a denial of service, never a crash). Honest clients' DP still
  holds: they clip themselves and the noise follows a public bound. A server colluding with all
  but one node of a round learns that node's vector (inherent to SecAgg). Per-client norm
  enforcement would need zero-knowledge validity proofs (RoFL, EIFFeL, ELSA): out of scope.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.secure_sum import Field, mask_stream


class ProtocolAbortError(ValueError):
    """A client refuses a stage (the message in one line). Internal: the client's wiring catches
    it and sends no reply, which the server treats as a dropout."""


@dataclass(frozen=True)
class SkippedRound:
    """The exchange released nothing: ``stage`` (0-3) where it stopped and why (server-internal)."""

    stage: int
    reason: str


@dataclass(frozen=True)
class ExchangeConfig:
    """The public parameters of one exchange: its place (run, round, exchange within the round),
    the threshold t, the field's bits and the vector's length."""

    run: str
    round: int
    exchange: int
    threshold: int
    bits: int
    length: int

    def __post_init__(self) -> None:
        Field(self.bits)
        if not (isinstance(self.threshold, int) and self.threshold >= 2):
            raise PolicyConfigError(
                f"secure_aggregation.threshold must be an integer >= 2 (got {self.threshold!r})"
            )
        if not (isinstance(self.length, int) and self.length >= 1):
            raise PolicyConfigError(f"a secure sum needs a vector length >= 1 (got {self.length!r})")

    @property
    def field(self) -> Field:
        return Field(self.bits)

    def domain(self, *parts: str | int) -> bytes:
        """Domain separation for hashes and masks: the run, round, exchange and ``parts``, each
        length-prefixed (so no two tuples give the same bytes)."""
        fields = [str(p).encode() for p in (self.run, self.round, self.exchange, *parts)]
        return b"".join(len(f).to_bytes(4, "little") + f for f in fields)


def default_threshold(num_neighbours: int) -> int:
    """t = ⌊k/2⌋ + 1 (at least 2) for k neighbours: above half of every neighbourhood."""
    return max(2, num_neighbours // 2 + 1)


def neighbourhoods(
    nodes: Sequence[int], num_neighbours: int | None = None, seed: bytes = b""
) -> dict[int, frozenset[int]]:
    """Each node's neighbours: all other nodes where ``num_neighbours`` is ``None`` or at least
    n − 1 (SecAgg); else a ring over the nodes ordered by SHA-256(``seed``, node), each node with
    k/2 neighbours on either side (SecAgg+; k even). Symmetric: v ∈ N(u) ⇔ u ∈ N(v)."""
    nodes = sorted(set(int(u) for u in nodes))
    n = len(nodes)
    if num_neighbours is not None and (num_neighbours < 2 or num_neighbours % 2):
        raise PolicyConfigError(
            f"secure_aggregation.num_shares must be an even number >= 2 (got {num_neighbours!r})"
        )
    if num_neighbours is None or num_neighbours >= n - 1:
        return {u: frozenset(nodes) - {u} for u in nodes}
    order = sorted(nodes, key=lambda u: hashlib.sha256(seed + u.to_bytes(8, "little")).digest())
    half = num_neighbours // 2
    return {
        u: frozenset(order[(i + k) % n] for k in range(-half, half + 1) if k) for i, u in enumerate(order)
    }


# ----- messages ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    config: ExchangeConfig
    neighbours: frozenset[int]


@dataclass(frozen=True)
class KeysAdvert:
    pk1: bytes
    pk2: bytes


@dataclass(frozen=True)
class ShareKeysRequest:
    keys: Mapping[int, KeysAdvert]


@dataclass(frozen=True)
class EncryptedShares:
    ciphertexts: Mapping[int, bytes]
    commitment: bytes


@dataclass(frozen=True)
class MaskRequest:
    ciphertexts: Mapping[int, bytes]


@dataclass(frozen=True)
class UnmaskRequest:
    alive: frozenset[int]
    dead: frozenset[int]


@dataclass(frozen=True)
class UnmaskReply:
    b_shares: Mapping[int, bytes]
    sk1_shares: Mapping[int, bytes]


# ----- crypto helpers (Flower's primitives, imported lazily) -------------------------------
def _asymmetric():
    """Flower's key pair generation and PEM (de)serialisation (``flwr.supercore.primitives.asymmetric``
    in 1.42); where a Flower release keeps them elsewhere, the same four functions on
    ``cryptography`` (SECP384R1, PKCS8/SubjectPublicKeyInfo PEM)."""
    try:
        from flwr.supercore.primitives import asymmetric

        return asymmetric
    except ImportError:  # pragma: no cover - a Flower release without that module
        return _CryptographyKeys


class _CryptographyKeys:
    """What :mod:`flwr.supercore.primitives.asymmetric` does, on ``cryptography`` directly."""

    @staticmethod
    def generate_key_pairs():
        from cryptography.hazmat.primitives.asymmetric import ec

        private_key = ec.generate_private_key(ec.SECP384R1())
        return private_key, private_key.public_key()

    @staticmethod
    def private_key_to_bytes(key) -> bytes:
        from cryptography.hazmat.primitives import serialization as ser

        return key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())

    @staticmethod
    def bytes_to_private_key(data: bytes):
        from cryptography.hazmat.primitives import serialization as ser

        return ser.load_pem_private_key(data, password=None)

    @staticmethod
    def public_key_to_bytes(key) -> bytes:
        from cryptography.hazmat.primitives import serialization as ser

        return key.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)

    @staticmethod
    def bytes_to_public_key(data: bytes):
        from cryptography.hazmat.primitives import serialization as ser

        return ser.load_pem_public_key(data)


def _agree(private_key: object, public_pem: bytes) -> bytes:
    """KA(sk, pk): Flower's ECDH + HKDF-SHA256, a urlsafe-base64 Fernet key of 32 bytes."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key

    return generate_shared_key(private_key, _asymmetric().bytes_to_public_key(public_pem))


def _commit(config: ExchangeConfig, node: int, seed: bytes) -> bytes:
    return hashlib.sha256(config.domain("commit", node) + b"\0" + seed).digest()


def _mask(config: ExchangeConfig, secret: bytes, *parts: str | int) -> np.ndarray:
    return mask_stream(secret, config.domain(*parts), config.length, config.field)


def _pair_mask(config: ExchangeConfig, fernet_key: bytes, u: int, v: int) -> np.ndarray:
    """The mask u adds for pair (u, v): +PRG where u < v, −PRG (mod M) where u > v."""
    stream = _mask(config, base64.urlsafe_b64decode(fernet_key), "pair", min(u, v), max(u, v))
    return stream if u < v else config.field.subtract(np.zeros_like(stream), stream)


# ----- client -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientState:
    """One node's state in one exchange; secrets live only here (``stage``: the next expected)."""

    node: int
    config: ExchangeConfig
    neighbours: frozenset[int]
    stage: int
    sk1: bytes = field(default=b"", repr=False)  # secrets stay out of any log line
    sk2: bytes = field(default=b"", repr=False)
    pk1: bytes = b""
    pk2: bytes = b""
    seed: bytes = field(default=b"", repr=False)
    keys: Mapping[int, KeysAdvert] = field(default_factory=dict, repr=False)
    masked_with: frozenset[int] = frozenset()
    shares: Mapping[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False)


def client_setup(node: int, message: Setup) -> tuple[ClientState, KeysAdvert]:
    """Stage 0: fresh key pairs (pk1 for masks, pk2 for encrypting shares)."""
    t = message.config.threshold
    if node in message.neighbours or len(message.neighbours) < t:
        raise ProtocolAbortError(
            f"node {node}: {len(message.neighbours)} neighbours (itself excluded) for t = {t}"
        )
    crypto = _asymmetric()
    sk1, pk1 = crypto.generate_key_pairs()
    sk2, pk2 = crypto.generate_key_pairs()
    state = ClientState(
        node=node,
        config=message.config,
        neighbours=frozenset(message.neighbours),
        stage=1,
        sk1=crypto.private_key_to_bytes(sk1),
        sk2=crypto.private_key_to_bytes(sk2),
        pk1=crypto.public_key_to_bytes(pk1),
        pk2=crypto.public_key_to_bytes(pk2),
    )
    return state, KeysAdvert(state.pk1, state.pk2)


def client_share_keys(state: ClientState, message: ShareKeysRequest) -> tuple[ClientState, EncryptedShares]:
    """Stage 1: Shamir shares (threshold t) of a fresh 32-byte b_u and of sk1_u, one per listed
    neighbour, each encrypted to it; and the hash of b_u (which lets the server check b_u)."""
    from flwr.common.secure_aggregation.crypto.shamir import create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt
    from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat

    _expect(state, 1)
    listed = sorted(message.keys)
    if not set(listed) <= state.neighbours or len(listed) < state.config.threshold:
        raise ProtocolAbortError(f"node {state.node}: keys of {len(listed)} nodes, not t of its neighbours")
    all_keys = [k for advert in message.keys.values() for k in (advert.pk1, advert.pk2)]
    if not all(isinstance(k, bytes) for k in all_keys):
        raise ProtocolAbortError(f"node {state.node}: a neighbour's key is not bytes")
    if len({*all_keys, state.pk1, state.pk2}) != len(all_keys) + 2:
        raise ProtocolAbortError(f"node {state.node}: public keys repeat")
    seed = os.urandom(32)
    b_shares = create_shares(seed, state.config.threshold, len(listed))
    sk_shares = create_shares(state.sk1, state.config.threshold, len(listed))
    sk2 = _asymmetric().bytes_to_private_key(state.sk2)
    try:
        ciphertexts = {
            v: encrypt(_agree(sk2, message.keys[v].pk2), share_keys_plaintext_concat(state.node, v, b, s))
            for v, b, s in zip(listed, b_shares, sk_shares, strict=True)
        }
    except Exception as error:  # an unparsable public key
        raise ProtocolAbortError(
            f"node {state.node}: a neighbour's key is invalid ({type(error).__name__})"
        ) from None
    new = replace(state, stage=2, seed=seed, keys=dict(message.keys))
    return new, EncryptedShares(ciphertexts, _commit(state.config, state.node, seed))


def client_mask(state: ClientState, message: MaskRequest, q: np.ndarray) -> tuple[ClientState, np.ndarray]:
    """Stage 2: decrypt and keep the neighbours' shares; send y_u = q_u + PRG(b_u) + Σ ±PRG(s_uv)
    mod M over the senders (``q``: the quantised signed vector, :meth:`Layout.quantise`)."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt
    from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate

    _expect(state, 2)
    config, u = state.config, state.node
    senders = sorted(message.ciphertexts)
    if not set(senders) <= set(state.keys) or len(senders) < config.threshold:
        raise ProtocolAbortError(
            f"node {u}: ciphertexts from {len(senders)} nodes, not t of its keyed neighbours"
        )
    q = np.asarray(q)
    if q.shape != (config.length,) or q.dtype.kind not in "iu":
        raise ValueError(f"a masked input is an integer vector of length {config.length}")
    crypto = _asymmetric()
    sk1, sk2 = crypto.bytes_to_private_key(state.sk1), crypto.bytes_to_private_key(state.sk2)
    shares = {}
    for v in senders:
        try:
            plain = decrypt(_agree(sk2, state.keys[v].pk2), message.ciphertexts[v])
            src, dst, b_share, sk_share = share_keys_plaintext_separate(plain)
        except Exception as error:
            raise ProtocolAbortError(
                f"node {u}: the ciphertext of {v} is invalid ({type(error).__name__})"
            ) from None
        if (src, dst) != (v, u):
            raise ProtocolAbortError(f"node {u}: the ciphertext of {v} names nodes {src} -> {dst}")
        shares[v] = (b_share, sk_share)
    f = config.field
    y = f.add(f.encode(q), _mask(config, state.seed, "self", u))
    for v in senders:
        y = f.add(y, _pair_mask(config, _agree(sk1, state.keys[v].pk1), u, v))
    return replace(state, stage=3, masked_with=frozenset(senders), shares=shares), y


def client_unmask(state: ClientState, message: UnmaskRequest) -> tuple[ClientState, UnmaskReply]:
    """Stage 3, answered once: b shares of the alive, sk1 shares of the dead; the state then
    forgets every secret."""
    _expect(state, 3)
    u, alive, dead = state.node, set(message.alive), set(message.dead)
    if alive & dead or u in dead:
        raise ProtocolAbortError(
            f"node {u}: nodes listed both alive and dead: {sorted(alive & dead | dead & {u})}"
        )
    alive.discard(u)
    if not (alive | dead) <= state.masked_with or len(alive) + 1 < state.config.threshold:
        raise ProtocolAbortError(
            f"node {u}: an unmask request for nodes it did not mask with, or under t alive"
        )
    reply = UnmaskReply(
        {v: state.shares[v][0] for v in sorted(alive)}, {v: state.shares[v][1] for v in sorted(dead)}
    )
    return ClientState(u, state.config, state.neighbours, 4), reply


def _expect(state: ClientState, stage: int) -> None:
    if state.stage != stage:
        raise ProtocolAbortError(f"node {state.node}: stage {stage} asked, stage {state.stage} expected")


# ----- server -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ServerState:
    """The server's state in one exchange: the neighbourhood graph over the sampled nodes, and
    what each stage has collected (``active``: the nodes still in)."""

    config: ExchangeConfig
    graph: Mapping[int, frozenset[int]]
    stage: int
    active: frozenset[int]
    keys: Mapping[int, KeysAdvert] = field(default_factory=dict)
    ciphertexts: Mapping[int, Mapping[int, bytes]] = field(default_factory=dict)
    commitments: Mapping[int, bytes] = field(default_factory=dict)
    masked_with: frozenset[int] = frozenset()
    total: np.ndarray | None = None

    def neighbours(self, u: int) -> frozenset[int]:
        return self.graph[u] & self.active


@dataclass(frozen=True, eq=False)
class SecureSum:
    """A released secure sum: Σ q_u mod M over ``survivors`` (U3), and who dropped after masking."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]


Step = tuple[ServerState, dict]


def server_setup(
    config: ExchangeConfig, nodes: Sequence[int], num_neighbours: int | None = None
) -> tuple[ServerState, dict[int, Setup]] | SkippedRound:
    """Stage 0: the neighbourhood graph (:func:`neighbourhoods`, seeded by the exchange's domain)
    and one setup message per node; skipped where some node would have fewer than t neighbours."""
    if num_neighbours is not None and num_neighbours < config.threshold:
        raise PolicyConfigError(
            f"secure_aggregation.num_shares {num_neighbours} is below the threshold {config.threshold}"
        )
    graph = neighbourhoods(nodes, num_neighbours, config.domain("graph"))
    if len(graph) < 2 or min(len(n) for n in graph.values()) < config.threshold:
        return SkippedRound(
            0, f"{len(graph)} nodes sampled: fewer than t = {config.threshold} neighbours each"
        )
    state = ServerState(config, graph, 1, frozenset(graph))
    return state, {u: Setup(config, graph[u]) for u in graph}


def server_share_keys(state: ServerState, adverts: Mapping[int, object]) -> Step | SkippedRound:
    """Stage 1: U1 = the nodes whose two keys parse and repeat no one else's; each gets its
    neighbours' keys."""
    _at(state, 1)
    valid = {
        u: advert
        for u, advert in adverts.items()
        if u in state.active
        and isinstance(advert, KeysAdvert)
        and _is_key(advert.pk1)
        and _is_key(advert.pk2)
    }
    seen: dict[bytes, int] = {}
    for advert in valid.values():
        for key in (advert.pk1, advert.pk2):
            seen[key] = seen.get(key, 0) + 1
    valid = {u: a for u, a in valid.items() if seen[a.pk1] == seen[a.pk2] == 1 and a.pk1 != a.pk2}
    state = _settle(replace(state, stage=2, active=frozenset(valid), keys=valid))
    if isinstance(state, SkippedRound):
        return SkippedRound(0, state.reason)
    return state, {u: ShareKeysRequest({v: valid[v] for v in state.neighbours(u)}) for u in state.active}


def server_forward(state: ServerState, replies: Mapping[int, object]) -> Step | SkippedRound:
    """Stage 2's requests: U2 = the nodes that sent a 32-byte hash and exactly one ciphertext per
    neighbour it was given (then pruned until every node's shares reach t others of U2); each gets
    the ciphertexts addressed to it by U2."""
    _at(state, 2)
    given = {u: state.neighbours(u) for u in state.active}
    valid = {
        u: r
        for u, r in replies.items()
        if u in state.active
        and isinstance(r, EncryptedShares)
        and isinstance(r.ciphertexts, Mapping)
        and isinstance(r.commitment, bytes)
        and len(r.commitment) == 32
        and set(r.ciphertexts) == given[u]
        and all(isinstance(c, bytes) for c in r.ciphertexts.values())
    }
    state = _settle(replace(state, stage=3, active=frozenset(valid)))
    if isinstance(state, SkippedRound):
        return SkippedRound(1, state.reason)
    state = replace(
        state,
        ciphertexts={u: dict(valid[u].ciphertexts) for u in state.active},
        commitments={u: valid[u].commitment for u in state.active},
        masked_with=state.active,
    )
    requests = {
        u: MaskRequest({v: state.ciphertexts[v][u] for v in sorted(state.neighbours(u))})
        for u in state.active
    }
    return state, requests


def server_collect_masked(
    state: ServerState, replies: Mapping[int, object], min_survivors: int = 2
) -> Step | SkippedRound:
    """Stage 3's requests: U3 = the nodes of U2 that sent a vector of Z_M of the right length;
    their sum mod M; each survivor gets its alive and dead neighbours. Skipped where fewer than
    ``min_survivors`` survive or some node's b_u or sk1_u could no longer reach t shares."""
    _at(state, 3)
    config, f = state.config, state.config.field
    survivors = frozenset(
        u for u, y in replies.items() if u in state.masked_with and f.is_element(y, config.length)
    )
    dead = state.masked_with - survivors
    if len(survivors) < max(2, min_survivors):
        return SkippedRound(2, f"{len(survivors)} masked inputs came back, under {max(2, min_survivors)}")
    for u in sorted(state.masked_with):
        holders = state.graph[u] & survivors
        if len(holders) < config.threshold:
            return SkippedRound(2, f"the shares of node {u} are held by {len(holders)} survivors, under t")
    total = np.zeros(config.length, dtype=np.uint64)
    for u in sorted(survivors):
        total = f.add(total, replies[u])
    state = replace(state, stage=4, active=survivors, total=total)
    return state, {
        u: UnmaskRequest(state.graph[u] & survivors, state.graph[u] & dead) for u in sorted(survivors)
    }


def server_unmask(state: ServerState, replies: Mapping[int, object]) -> SecureSum | SkippedRound:
    """The sum of U3's inputs mod M: remove each survivor's self mask (b_u rebuilt from t shares,
    checked against its hash) and the survivors' pair masks with each dropped node (sk1 rebuilt
    from t shares, checked against its pk1). Skipped on any missing or failing reconstruction."""
    _at(state, 4)
    config, f = state.config, state.config.field
    survivors, dead = state.active, state.masked_with - state.active
    valid = {
        u: r
        for u, r in replies.items()
        if u in survivors
        and isinstance(r, UnmaskReply)
        and isinstance(r.b_shares, Mapping)
        and isinstance(r.sk1_shares, Mapping)
        and set(r.b_shares) == state.graph[u] & survivors
        and set(r.sk1_shares) == state.graph[u] & dead
    }
    total = np.asarray(state.total, dtype=np.uint64)
    crypto = _asymmetric()
    for u in sorted(survivors | dead):
        kind = "b" if u in survivors else "sk1"
        shares = [getattr(valid[v], f"{kind}_shares")[u] for v in sorted(state.graph[u] & set(valid))]
        if len(shares) < config.threshold:
            return SkippedRound(3, f"{len(shares)} {kind} shares of node {u} came back, under t")
        secret = _combine(shares[: config.threshold])
        if secret is None:
            return SkippedRound(3, f"the {kind} shares of node {u} do not combine")
        if u in survivors:
            if _commit(config, u, secret) != state.commitments[u]:
                return SkippedRound(
                    3, f"the b shares of node {u} rebuild a seed that does not match its hash"
                )
            total = f.subtract(total, _mask(config, secret, "self", u))
            continue
        try:
            sk1 = crypto.bytes_to_private_key(secret)
            ok = crypto.public_key_to_bytes(sk1.public_key()) == state.keys[u].pk1
        except Exception:
            ok = False
        if not ok:
            return SkippedRound(3, f"the sk1 shares of node {u} rebuild a key that does not match its pk1")
        for v in sorted(state.graph[u] & survivors):
            total = f.subtract(total, _pair_mask(config, _agree(sk1, state.keys[v].pk1), v, u))
    return SecureSum(total, tuple(sorted(survivors)), tuple(sorted(dead)))


def _at(state: ServerState, stage: int) -> None:
    if state.stage != stage:
        raise ValueError(f"the server's secure aggregation is at stage {state.stage}, not {stage}")


def _is_key(pem: object) -> bool:
    """Whether ``pem`` is a PEM-serialised elliptic-curve public key."""
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        return isinstance(pem, bytes) and isinstance(
            _asymmetric().bytes_to_public_key(pem), ec.EllipticCurvePublicKey
        )
    except Exception:
        return False


def _combine(shares: list[bytes]) -> bytes | None:
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares

    if not all(isinstance(s, bytes) and len(s) == len(shares[0]) and len(s) > 4 for s in shares):
        return None
    try:
        return combine_shares(shares)
    except Exception:
        return None


def _settle(state: ServerState) -> ServerState | SkippedRound:
    """Drop, until none is left, every active node with fewer than t active neighbours (no one
    has masked with it yet, so leaving it out is safe); skipped where fewer than 2 nodes stay."""
    active = set(state.active)
    while True:
        short = {u for u in active if len(state.graph[u] & active) < state.config.threshold}
        if not short:
            break
        active -= short
    if len(active) < max(2, state.config.threshold):
        return SkippedRound(
            state.stage, f"{len(active)} nodes left with t = {state.config.threshold} neighbours each"
        )
    return replace(state, active=frozenset(active))
