"""The arithmetic of a secure sum: quantiser, field Z_M, public projection and mask generator.

Secure aggregation (:mod:`fairclip.strategies.secagg_protocol`) adds integers modulo M, so each
client's clipped contribution is first quantised. A masked vector is laid out in **segments**
(:class:`Segment`): a float segment (a contribution, a unit direction) of L2 bound s and length d,
or an integer segment (bits, one-hot counts) whose entries are integers in [0, bound].

**Quantiser** (float segment; design memo, section 3). With the relative rounding slack ρ::

    γ = ρ·s/√d,   B = ⌈√d/ρ⌉
    q_j = ⌊x_j/γ⌋ + Bernoulli(x_j/γ − ⌊x_j/γ⌋),  clamped to [−B, B]

*Claim:* for every x with ||x||₂ ≤ s, every |q_j| ≤ B and ||γq||₂ ≤ s(1+ρ) =: s_q
(:func:`quantised_sensitivity`), the sensitivity the noise of the released sum must use.

*Proof.* q_j is ⌊x_j/γ⌋ or ⌈x_j/γ⌉, so |γq_j − x_j| ≤ γ. Since |x_j| ≤ ||x|| ≤ s, |x_j/γ| ≤ √d/ρ ≤ B
and B is an integer, so ⌊x_j/γ⌋ ≥ −B and ⌈x_j/γ⌉ ≤ B: the clamp never acts in exact arithmetic
(it is kept as the guard of |q_j| ≤ B against floating-point rounding, and moves q_j only
towards x_j/γ). Hence ||γq − x||₂ ≤ γ√d = ρ·s and, by the triangle inequality,
||γq||₂ ≤ ||x||₂ + ρ·s ≤ s(1+ρ). ∎

Floating point: x_j/γ is computed with relative error 2⁻⁵³, which could in principle push one
rounding a hair past the bound. The quantiser therefore checks the claim **exactly** on every
row (integer ||q||² against the rational (s_q/γ)², :func:`_exact_squares`); a row that fails (none
was ever seen) is rounded towards zero instead, which keeps ||γq|| ≤ ||x||. The quantiser is
unbiased, E[γq] = x, except on that never-seen path. Rounding randomness is not DP noise.

Refuse or clip? A row of norm above s is **clipped** to s (:func:`fairclip.strategies.clipping.clip_rows`,
the same guarded projection that ends :meth:`Policy.client_side`): the policy has clipped already,
so only floating-point round-off can put a row there, and refusing would drop an honest client
for it. A row that is not finite is refused (:class:`ValueError`): the policy sends zeros for one.

Integer segments use γ = 1: exact, no widening; an entry that is not an integer in [0, bound]
is refused.

**Field.** M = 2^bits with bits 32 or 64 (:func:`modulus_bits`), chosen so that M ≥ 4·n_max·B + 2
for the largest per-coordinate bound B of the layout and the largest public number of summands
n_max. A signed vector is sent as q mod M; the sum of at most n_max honest vectors then lies in
[−T, T] with T = n_max·B, well inside [−M/2, M/2), so decoding (v ≥ M/2 ↦ v − M) returns it
exactly: no wrap. n_max should be public: the population N (a round's sampled count is not, under
Poisson sampling, and 32 versus 64 bits would tell the clients something about it). The factor 4
(not 2, which no wrap alone needs) leaves room for the fold below.

**Release** (memo, section 5): fold, then project. A malicious client can send any vector in
Z_M^d, so the server's view of the total is a point on the circle Z_M in each coordinate, anywhere.
Decoding cuts that circle at M/2, and a cut is not Lipschitz: where the adversary parks the total
just below M/2, one honest client's small vector carries it to just above −M/2, and a projection
of the decoded value would then jump by its whole range (2·n_max·s_q), not by s_q. So each decoded
coordinate v of a segment with T = n_max·B (n_max·bound for an integer segment) is first
**folded** back into [−T, T] by the public tent map::

    fold(v) = v                     for |v| <= T
              sign(v)·(2T − |v|)    for T < |v| <= 2T
              0                     for |v| > 2T

It is the identity on every honest sum, 1-Lipschitz, and equal (0) on both sides of the cut, as
M/2 − 1 ≥ 2T: a 1-Lipschitz function of the circle, so
|fold(u_j) − fold(w_j)| <= the circular distance of u_j and w_j, which for two totals that differ
by one honest client's q is |q_j|. Then each float segment is projected onto the L2 ball of
radius n_max·s_q and each integer segment clamped to [0, n_max·bound], both projections onto
convex sets and 1-Lipschitz. The composition moves by at most ||γq||₂ <= s_q per float segment
(and the integer segments' own bound) when one honest client joins or leaves, wherever the
malicious clients put the total: the sensitivity the noise uses. Nothing is decided from the
un-noised sum (:meth:`Layout.release`). The ball's projection is the exact x·min(1, R/||x||),
not :func:`clip_rows`, whose guard band below the bound makes it jump by SAFETY·R there
(R = n_max·s_q: a jump that would add to s_q).

**Masks.** :func:`mask_stream` expands a full 32-byte secret with HKDF-SHA256 (info = fairclip's
domain, run, round, exchange and the pair or node) into an AES-256-CTR key and reads uniform words
mod M from its key stream -- not Flower's 32-bit-seeded Mersenne Twister (flwrlabs/flower#7522).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fairclip.strategies.clipping import clip_rows, row_norms
from fairclip.strategies.errors import PolicyConfigError

DEFAULT_RHO = 2.0**-10
"""The default relative rounding slack ρ: the noise is widened by 0.1 %, and B = 1024·√d."""

MAX_STEPS = 2**31
"""Largest per-coordinate bound B (keeps q_j² exact in the checks, and ρ sane)."""

MAX_LENGTH = 2**30
"""Longest vector a layout accepts (keeps the exact square sums within int64)."""

FIELD_BITS = (32, 64)

MASK_DOMAIN = b"fairclip/secagg/v1"


def quantised_sensitivity(bound: float, rho: float = DEFAULT_RHO) -> float:
    """s_q = s·(1+ρ): the L2 bound of γ·q for every input of norm ≤ s (module docstring), the
    sensitivity the noise of a quantised float segment must be calibrated to."""
    _check_rho(rho)
    if not (math.isfinite(bound) and bound > 0):
        raise PolicyConfigError(f"a secure-sum segment needs a finite L2 bound > 0 (got {bound!r})")
    return float(bound) * (1.0 + float(rho))


def _check_rho(rho: float) -> None:
    if not (math.isfinite(rho) and 0 < rho <= 1):
        raise PolicyConfigError(f"secure_aggregation.rounding_slack must be in (0, 1] (got {rho!r})")


@dataclass(frozen=True)
class Segment:
    """One part of a masked vector: ``length`` entries that are either floats of L2 norm at most
    ``bound`` (quantised with step γ = ρ·bound/√length), or, with ``integer``, integers in
    [0, ``bound``] (bits, one-hot counts: γ = 1, exact)."""

    length: int
    bound: float
    integer: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.length, int) and 1 <= self.length <= MAX_LENGTH):
            raise PolicyConfigError(f"a secure-sum segment needs 1 <= length <= 2**30 (got {self.length!r})")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise PolicyConfigError(f"a secure-sum segment needs a finite bound > 0 (got {self.bound!r})")
        if self.integer and (self.bound != int(self.bound) or self.bound >= MAX_STEPS):
            raise PolicyConfigError(f"an integer segment needs an integer bound < 2**31 (got {self.bound!r})")


@dataclass(frozen=True)
class Layout:
    """The segments of one masked vector, in order, and the rounding slack ``rho``."""

    segments: tuple[Segment, ...]
    rho: float = DEFAULT_RHO

    def __post_init__(self) -> None:
        _check_rho(self.rho)
        if not self.segments or self.length > MAX_LENGTH:
            raise PolicyConfigError("a secure-sum layout needs 1 to 2**30 entries in all")
        if max(self.max_steps) > MAX_STEPS:
            raise PolicyConfigError(
                f"secure_aggregation.rounding_slack {self.rho!r} is too small for segments of length "
                f"{max(s.length for s in self.segments)}: a coordinate would need over 2**31 steps"
            )

    @property
    def length(self) -> int:
        return sum(segment.length for segment in self.segments)

    @property
    def steps(self) -> tuple[float, ...]:
        """γ of each segment: ρ·s/√d for a float segment, 1 for an integer one."""
        return tuple(
            1.0 if seg.integer else self.rho * seg.bound / math.sqrt(seg.length) for seg in self.segments
        )

    @property
    def max_steps(self) -> tuple[int, ...]:
        """B of each segment: the largest |q_j| a client may send (⌈√d/ρ⌉, or the integer bound)."""
        return tuple(
            int(seg.bound) if seg.integer else math.ceil(math.sqrt(seg.length) / self.rho)
            for seg in self.segments
        )

    @property
    def sensitivities(self) -> tuple[float, ...]:
        """The L2 bound of one client's dequantised float segment, s(1+ρ); an integer segment's
        ``bound`` unchanged (its policy knows its sensitivity: quantisation is exact there)."""
        return tuple(
            seg.bound if seg.integer else quantised_sensitivity(seg.bound, self.rho) for seg in self.segments
        )

    def _slices(self) -> list[slice]:
        ends = np.cumsum([0, *(seg.length for seg in self.segments)])
        return [slice(int(a), int(b)) for a, b in itertools.pairwise(ends)]

    def quantise(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The int64 vector q (one row per input row, for a 2-D ``x``) of the module docstring:
        unbiased stochastic rounding per float segment (rows above the bound clipped to it first),
        integer segments checked and passed through. ``rng`` draws the rounding."""
        x = np.asarray(x, dtype=np.float64)
        rows = np.atleast_2d(x)
        if rows.ndim != 2 or rows.shape[1] != self.length:
            raise ValueError(f"a secure-sum vector has {self.length} entries (got shape {x.shape})")
        if not np.isfinite(rows).all():
            raise ValueError(
                "a secure-sum vector must be finite (a policy sends zeros for a diverged client)"
            )
        q = np.empty(rows.shape, dtype=np.int64)
        for seg, part, gamma, steps in zip(
            self.segments, self._slices(), self.steps, self.max_steps, strict=True
        ):
            q[:, part] = (
                _integers(rows[:, part], steps)
                if seg.integer
                else _round(rows[:, part], seg.bound, gamma, steps, self.rho, rng)
            )
        return q if x.ndim == 2 else q[0]

    def dequantise(self, total: np.ndarray) -> np.ndarray:
        """γ·(a signed integer sum), segment by segment, as float64."""
        total = np.asarray(total, dtype=np.int64)
        out = np.empty(total.shape, dtype=np.float64)
        for part, gamma in zip(self._slices(), self.steps, strict=True):
            out[..., part] = total[..., part].astype(np.float64) * gamma
        return out

    def project(self, values: np.ndarray, max_summands: int) -> tuple[np.ndarray, bool]:
        """``values`` (a dequantised sum) projected onto the public set of the module docstring,
        and whether anything moved (an honest sum of at most ``max_summands`` rows never moves;
        a move is for the server-internal record, never for a decision)."""
        values = np.array(values, dtype=np.float64)
        moved = False
        for seg, part in zip(self.segments, self._slices(), strict=True):
            if seg.integer:
                clamped = np.clip(values[part], 0.0, max_summands * seg.bound)
                moved |= bool((clamped != values[part]).any())
                values[part] = clamped
            else:  # the exact projection x·min(1, R/||x||): continuous, unlike clip_rows' guard band
                radius = max_summands * quantised_sensitivity(seg.bound, self.rho)
                norm = float(row_norms(values[None, part])[0])
                if norm > radius:
                    values[part] *= radius / norm
                    moved = True
        return values, moved

    def fold(self, decoded: np.ndarray, max_summands: int) -> tuple[np.ndarray, bool]:
        """Each decoded coordinate folded into [−T, T] by the tent map of the module docstring
        (T = n_max·B of its segment): the identity on an honest sum, 1-Lipschitz on the circle
        Z_M; with whether anything moved."""
        decoded = np.asarray(decoded, dtype=np.int64)
        folded = decoded.copy()
        for part, steps in zip(self._slices(), self.max_steps, strict=True):
            limit = int(max_summands) * int(steps)
            clipped = np.clip(decoded[part], -2 * limit, 2 * limit)  # |v| > 2T folds to 0 either way
            size = np.abs(clipped)  # exact: 2T <= M/2 − 1 <= 2^63 − 1
            folded[part] = np.sign(clipped) * np.where(size <= limit, size, 2 * limit - size)
        return folded, bool((folded != decoded).any())

    def release(self, field: Field, total: np.ndarray, max_summands: int) -> tuple[np.ndarray, bool]:
        """The server's view of a secure sum mod M: decoded, folded, dequantised and projected
        (before noise; module docstring); with whether the fold or the projection moved it."""
        if field.modulus < needed_modulus(max_summands, max(self.max_steps)):
            raise PolicyConfigError(
                f"a {field.bits}-bit field is too small to fold a sum of {max_summands} of these vectors"
            )
        folded, folded_moved = self.fold(field.decode(total), max_summands)
        values, projected_moved = self.project(self.dequantise(folded), max_summands)
        return values, folded_moved or projected_moved

    def field(self, max_summands: int) -> Field:
        """The field Z_M for at most ``max_summands`` summands of this layout."""
        return Field(modulus_bits(max_summands, max(self.max_steps)))


def _integers(part: np.ndarray, steps: int) -> np.ndarray:
    if not ((part == np.round(part)) & (part >= 0) & (part <= steps)).all():
        raise ValueError(f"an integer secure-sum segment holds integers in [0, {steps}]")
    return part.astype(np.int64)


def _round(
    part: np.ndarray, bound: float, gamma: float, steps: int, rho: float, rng: np.random.Generator
) -> np.ndarray:
    part = clip_rows(part, bound)
    scaled = part / gamma
    low = np.floor(scaled)
    q = low + (rng.random(scaled.shape) < (scaled - low))
    q = np.clip(q, -steps, steps).astype(np.int64)
    limit = Fraction(quantised_sensitivity(bound, rho)) ** 2 / Fraction(gamma) ** 2
    for row in np.flatnonzero([Fraction(n) > limit for n in _exact_squares(q)]):
        q[row] = np.clip(np.trunc(scaled[row]), -steps, steps).astype(np.int64)
        if Fraction(_exact_squares(q[row : row + 1])[0]) > limit:  # pragma: no cover - cannot happen
            raise ArithmeticError("a quantised row exceeds s(1+rho) even rounded towards zero")
    return q


def _exact_squares(q: np.ndarray) -> list[int]:
    """Σ_j q_j² of each row of an int64 matrix with |q_j| ≤ 2³¹, exactly (Python ints): q_j is
    split as a·2¹⁶ + b with 0 ≤ b < 2¹⁶, so every partial sum stays within int64."""
    a, b = np.divmod(q, 1 << 16)
    aa, ab, bb = (np.einsum("ij,ij->i", u, v) for u, v in ((a, a), (a, b), (b, b)))
    return [(int(x) << 32) + (int(y) << 17) + int(z) for x, y, z in zip(aa, ab, bb, strict=True)]


def needed_modulus(max_summands: int, max_step: int) -> int:
    """4·n_max·B + 2, the smallest M the release needs: a sum of ``max_summands`` vectors with
    entries in [−B, B] never wraps, and the fold of the module docstring fits (M/2 − 1 ≥ 2·n_max·B)."""
    if not (int(max_summands) == max_summands >= 1 and int(max_step) == max_step >= 1):
        raise PolicyConfigError(
            f"a secure sum needs n_max >= 1 and B >= 1 (got {max_summands!r}, {max_step!r})"
        )
    return 4 * int(max_summands) * int(max_step) + 2


def modulus_bits(max_summands: int, max_step: int) -> int:
    """The bits of M = 2^bits, 32 where it suffices else 64, such that M ≥ 4·n_max·B + 2
    (:func:`needed_modulus`). :class:`PolicyConfigError` where even 2^64 cannot hold it."""
    needed = needed_modulus(max_summands, max_step)
    for bits in FIELD_BITS:
        if needed <= 2**bits:
            return bits
    raise PolicyConfigError(
        f"a secure sum of {max_summands} vectors with entries up to {max_step} needs more than 64 bits; "
        "raise secure_aggregation.rounding_slack or sample fewer clients"
    )


@dataclass(frozen=True)
class Field:
    """Z_M with M = 2^``bits``; its elements are uint64 arrays with entries < M."""

    bits: int

    def __post_init__(self) -> None:
        if self.bits not in FIELD_BITS:
            raise PolicyConfigError(f"secure_aggregation.modulus_bits must be 32 or 64 (got {self.bits!r})")

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @property
    def _mask(self) -> np.uint64:
        return np.uint64(self.modulus - 1)

    def encode(self, q: np.ndarray) -> np.ndarray:
        """A signed integer vector as its residues mod M (two's complement, cut to ``bits``)."""
        return np.asarray(q, dtype=np.int64).view(np.uint64) & self._mask

    def decode(self, v: np.ndarray) -> np.ndarray:
        """Residues mod M as signed integers in [−M/2, M/2): v ≥ M/2 ↦ v − M."""
        v = np.asarray(v, dtype=np.uint64) & self._mask
        if self.bits == 64:
            return v.view(np.int64)
        signed = v.astype(np.int64)
        return np.where(signed >= self.modulus // 2, signed - self.modulus, signed)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64)) & self._mask

    def subtract(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (np.asarray(a, dtype=np.uint64) - np.asarray(b, dtype=np.uint64)) & self._mask

    def sum(self, rows: np.ndarray) -> np.ndarray:
        """Σ rows mod M of signed integer rows (a 2-D array): the unmasked secure sum, which the
        masked protocol's result equals bit for bit (what an engine without masks computes)."""
        total = np.zeros(np.shape(rows)[1], dtype=np.uint64)
        for row in np.asarray(rows, dtype=np.int64):
            total = self.add(total, self.encode(row))
        return total

    def is_element(self, v: object, length: int) -> bool:
        """Whether ``v`` is a uint64 vector of ``length`` residues mod M (a reply's check)."""
        return (
            isinstance(v, np.ndarray)
            and v.dtype == np.uint64
            and v.shape == (length,)
            and bool((v <= self._mask).all())
        )


def mask_stream(secret: bytes, info: bytes, length: int, field: Field) -> np.ndarray:
    """``length`` uniform elements of Z_M expanded from a 32-byte ``secret``: HKDF-SHA256 (info =
    :data:`MASK_DOMAIN` + ``info``) gives an AES-256 key whose CTR key stream, read as
    little-endian words of ``bits`` bits, is the mask. Each key is used for one stream."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if len(secret) != 32:
        raise ValueError("a mask secret is 32 bytes")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=MASK_DOMAIN + b"|" + info).derive(secret)
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(length * field.bits // 8)) + encryptor.finalize()
    return np.frombuffer(stream, dtype=f"<u{field.bits // 8}").astype(np.uint64)
