"""What chips say to each other, and how long it takes: the alpha-beta cost model.

Pure Python (no torch), like the other calculators. Three ideas:

* **Link registry** (:data:`LINKS`): the links a serving replica talks over,
  each with its bandwidth, a per-exchange latency and its public source.
* **The alpha-beta model**: one exchange costs a fixed latency ``alpha`` plus
  ``bytes / bandwidth`` (``beta`` is the seconds per byte). Every collective's
  default ("simple") charges one ``alpha``: the all-reduce and the all-to-all
  alike. Named schedules charge one per step that waits for the last: a ring
  all-reduce over ``p`` chips makes ``2 (p - 1)`` exchanges of ``bytes / p``
  each; a pairwise all-to-all makes ``p - 1``.
* **The per-step bill** of tensor splitting (:func:`tensor_parallel_bill`): two
  all-reduces per layer (one after attention, one after the MLP), each carrying
  every token's residual-stream row.

The running example's figures come out of :func:`tensor_parallel_bill` with the
"simple" algorithm (``bytes / link bandwidth``, no ring factor): 128 people x
12,288 numbers x 2 bytes = 3.1 MB per all-reduce, two per layer x 80 layers =
160 per step, 503 MB per step, 0.56 ms at 900 GB/s and 10 ms at 50 GB/s.

Pipeline bubbles (:func:`bubble_fraction`) and the bytes each chip reads under
tensor or pipeline splitting (:func:`weight_bytes_per_chip`) live here too:
they are the arithmetic of splitting, and need no torch.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Mapping

from servelab import sources
from servelab.specs import GB, TB, ModelConfig, get_model

__all__ = [
    "Link", "LINKS", "get_link", "one_way", "US", "allreduce_message_bytes", "allreduces_per_step",
    "exchange_seconds", "allreduce_seconds", "all_to_all_seconds", "CommBill",
    "tensor_parallel_bill", "bubble_fraction", "pipeline_span", "weight_bytes_per_chip",
    "text_bytes", "BYTES_PER_TOKEN_ENGLISH", "ALGORITHMS", "ALL_TO_ALL_ALGORITHMS", "fit_alpha_beta",
    "NCCL_SCHEDULES", "nccl_allreduce_latency_s", "nccl_allreduce_seconds", "nccl_bill",
]

US = 1e-6

#: "several microseconds" per exchange: an assumed fixed cost for one whole small
#: collective on NVLink-class links, 5 us (one-shot custom all-reduce kernels, as in
#: vLLM and TensorRT-LLM, reach a few microseconds). NCCL's own model charges more:
#: see :func:`nccl_allreduce_latency_s` (about 15 us for a small 8-GPU ring).
NVLINK_LATENCY_S = 5 * US
#: Network links (InfiniBand/RoCE through a switch) add switch and NIC hops: ~10 us assumed.
NETWORK_LATENCY_S = 10 * US

#: About 4 characters of English per token is OpenAI's published rule of thumb
#: ("one token is roughly 4 characters of English text",
#: https://help.openai.com/en/articles/4936856-what-are-tokens-and-how-to-count-them).
BYTES_PER_TOKEN_ENGLISH = 4

ALGORITHMS = ("simple", "ring")
#: All-to-all schedules: every peer at once (one latency) or one peer at a time (p - 1).
ALL_TO_ALL_ALGORITHMS = ("simple", "pairwise")


@dataclass(frozen=True)
class Link:
    """A link between chips.

    ``bandwidth`` is bytes per second one chip can push to its peers (the
    vendor's per-GPU figure). ``chips`` is the size of the link domain: how many
    chips share this fabric (8 in an NVLink server, 72 in an NVL72 rack, 0 when
    the link is a network that scales out without a fixed domain).
    ``aggregate_bandwidth`` is the vendor's combined figure for the domain,
    when one is published.

    NVIDIA's NVLink figures count both directions (900 GB/s per H100 is about
    450 GB/s each way); the running example's figures, and this registry, charge
    bytes against the headline figure. Halve it for a one-way estimate:
    ``bidirectional`` marks such figures, and :func:`one_way` does the halving.
    """

    name: str
    bandwidth: float
    latency_s: float
    chips: int = 0
    aggregate_bandwidth: float | None = None
    source: str = ""
    bidirectional: bool = False

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"link {self.name}: bandwidth must be positive (bytes/s), got {self.bandwidth!r}")
        if self.latency_s < 0:
            raise ValueError(f"link {self.name}: latency_s cannot be negative, got {self.latency_s!r}")
        if self.chips < 0:
            raise ValueError(f"link {self.name}: chips cannot be negative, got {self.chips!r}")


LINKS: dict[str, Link] = {}


def _register(link: Link) -> Link:
    LINKS[link.name.lower()] = link
    return link


def _cited(key: str) -> str:
    src = sources.get(key)
    return f"{src.title}: {src.what}: {src.url}"


# Published NVLink and NVL72 figures come from servelab.sources, so the references
# appendix and these links cannot drift apart.
NVLINK_H100 = _register(Link(
    name="NVLink H100", bandwidth=sources.value("nvlink4_bandwidth"), latency_s=NVLINK_LATENCY_S, chips=8,
    bidirectional=True,
    source=_cited("nvlink4_bandwidth")))

HGX_H100_8 = _register(Link(
    name="HGX H100 8-GPU", bandwidth=sources.value("nvlink4_bandwidth"), latency_s=NVLINK_LATENCY_S, bidirectional=True,
    chips=8, aggregate_bandwidth=7.2 * TB,
    source="NVIDIA HGX H100 8-GPU: eight H100 SXM on four NVSwitches, 900 GB/s per GPU, "
           "7.2 TB/s total: https://www.nvidia.com/en-us/data-center/hgx/"))

GB200_NVL72 = _register(Link(
    name="GB200 NVL72", bandwidth=sources.value("nvlink5_bandwidth"), latency_s=NVLINK_LATENCY_S, bidirectional=True,
    chips=int(sources.value("nvl72_gpus")), aggregate_bandwidth=sources.value("nvl72_nvlink_bandwidth"),
    source=_cited("nvl72_nvlink_bandwidth") + "; per GPU: " + _cited("nvlink5_bandwidth")))

NETWORK_400G = _register(Link(
    name="400G network", bandwidth=50 * GB, latency_s=NETWORK_LATENCY_S, chips=0,
    source="NVIDIA ConnectX-7 / Quantum-2 InfiniBand NDR: 400 Gb/s per port = 50 GB/s "
           "(bits / 8): https://www.nvidia.com/en-us/networking/infiniband/quantum-2/"))


def one_way(link: Link | str) -> Link:
    """The link at the bandwidth one direction gets: half a ``bidirectional`` headline.

    NVIDIA quotes NVLink in both directions at once (900 GB/s per H100 is 450 GB/s
    each way). A collective's bytes leave on one direction and arrive on the
    other, so its time is bytes over the one-way figure. A network port's rate
    (400 Gb/s) is already per direction: such a link comes back unchanged.
    """
    from dataclasses import replace as _replace
    link = get_link(link)
    if not link.bidirectional:
        return link
    return _replace(link, name=f"{link.name}, one way", bandwidth=link.bandwidth / 2,
                    aggregate_bandwidth=None if link.aggregate_bandwidth is None else link.aggregate_bandwidth / 2,
                    bidirectional=False)


def get_link(name: str | Link) -> Link:
    """Look a link up by name (case-insensitive); a :class:`Link` passes through."""
    if isinstance(name, Link):
        return name
    try:
        return LINKS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; known links: {sorted(l.name for l in LINKS.values())}. "
                         "Build another with Link(name, bandwidth=bytes_per_s, latency_s=...)") from None


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------

def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _non_negative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------
# message sizes
# ---------------------------------------------------------------------------

def allreduce_message_bytes(tokens: int, hidden_size: int, bytes_per_number: float = 2) -> int:
    """Bytes one tensor-parallel all-reduce carries: every token's residual row.

    After attention (and again after the MLP) each chip holds a partial sum of
    the ``[tokens, hidden_size]`` output; the all-reduce adds them up. In a
    decode step ``tokens`` is the number of people in the batch (one new token each).
    """
    _positive_int("tokens", tokens)
    _positive_int("hidden_size", hidden_size)
    _positive("bytes_per_number", bytes_per_number)
    return int(round(tokens * hidden_size * bytes_per_number))


def allreduces_per_step(num_layers: int, per_layer: int = 2) -> int:
    """Two all-reduces per layer under tensor splitting: after attention and after the MLP."""
    _positive_int("num_layers", num_layers)
    _positive_int("per_layer", per_layer)
    return num_layers * per_layer


# ---------------------------------------------------------------------------
# the alpha-beta model
# ---------------------------------------------------------------------------

def exchange_seconds(nbytes: float, link: Link | str, latency_s: float | None = None) -> float:
    """One exchange: ``alpha + bytes / bandwidth``."""
    link = get_link(link)
    _non_negative("nbytes", nbytes)
    alpha = link.latency_s if latency_s is None else _non_negative("latency_s", latency_s)
    return alpha + nbytes / link.bandwidth


def allreduce_seconds(nbytes: float, link: Link | str, world_size: int = 8, algorithm: str = "simple",
                      latency_s: float | None = None) -> float:
    """Time of one all-reduce of an ``nbytes`` tensor among ``world_size`` chips.

    * ``"simple"`` -- the guide's model: one latency plus ``nbytes / bandwidth``
      (the whole message crosses each chip's link once). A floor: only a switch
      that adds inside the fabric (NVLink SHARP) comes close; a ring sends
      ``2 (p - 1) / p`` of the message, and the headline NVLink bandwidth counts
      both directions.
    * ``"ring"`` -- the textbook ring: reduce-scatter then all-gather,
      ``2 (p - 1)`` steps of ``nbytes / p`` each, so
      ``2 (p - 1) alpha + 2 (p - 1) / p * nbytes / bandwidth``. Close to twice
      the simple figure for 8 chips: each byte is sent once to be added and once
      to be shared back.
    """
    link = get_link(link)
    _non_negative("nbytes", nbytes)
    _positive_int("world_size", world_size)
    alpha = link.latency_s if latency_s is None else _non_negative("latency_s", latency_s)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if world_size == 1:
        return 0.0
    if algorithm == "simple":
        return alpha + nbytes / link.bandwidth
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / link.bandwidth


def all_to_all_seconds(nbytes_per_chip: float, link: Link | str, world_size: int,
                       algorithm: str = "simple", latency_s: float | None = None) -> float:
    """All-to-all: each chip sends ``(p - 1) / p`` of its ``nbytes_per_chip`` to the others.

    The bytes term is ``(p - 1) / p * nbytes / bandwidth`` (every byte bound for
    another chip shares this chip's link). The latency term follows the same
    model as :func:`allreduce_seconds`, one ``alpha`` per step that must wait
    for the one before:

    * ``"simple"`` -- one latency: the chip posts its sends to every peer at
      once (NCCL's grouped sends, torch's ``all_to_all_single``), and the
      exchanges overlap. The same rule the simple all-reduce follows, so the
      two collectives compare fairly.
    * ``"pairwise"`` -- ``p - 1`` latencies: one exchange with each peer in
      turn (the textbook pairwise schedule). An upper bound on the fixed delay.
    """
    link = get_link(link)
    _non_negative("nbytes_per_chip", nbytes_per_chip)
    _positive_int("world_size", world_size)
    alpha = link.latency_s if latency_s is None else _non_negative("latency_s", latency_s)
    if algorithm not in ALL_TO_ALL_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALL_TO_ALL_ALGORITHMS}, got {algorithm!r}")
    p = world_size
    if p == 1:
        return 0.0
    steps = 1 if algorithm == "simple" else p - 1
    return steps * alpha + (p - 1) / p * nbytes_per_chip / link.bandwidth


@dataclass(frozen=True)
class CommBill:
    """The communication of one decode step under tensor splitting."""

    message_bytes: int       # one all-reduce
    count: int               # all-reduces per step
    link: str
    algorithm: str
    seconds_each: float
    latency_each: float = 0.0  # the fixed-delay part of seconds_each

    @property
    def total_bytes(self) -> int:
        return self.message_bytes * self.count

    @property
    def seconds(self) -> float:
        return self.seconds_each * self.count

    @property
    def latency_share(self) -> float:
        """Fraction of the step's communication time that is fixed latency, not bytes."""
        return self.latency_each / self.seconds_each if self.seconds_each else 0.0

    def as_dict(self) -> dict:
        return {"message_bytes": self.message_bytes, "count": self.count, "total_bytes": self.total_bytes,
                "link": self.link, "algorithm": self.algorithm, "seconds_each": self.seconds_each,
                "seconds": self.seconds}


def _tensor_parallel_step(model, batch: int, link, bytes_per_number: float):
    """(link, bytes of one all-reduce, all-reduces per step) of one split decode step."""
    if isinstance(model, Mapping):
        model = ModelConfig.from_hf_dict(model)
    c = get_model(model)
    message = allreduce_message_bytes(batch, c.hidden_size, bytes_per_number)
    return get_link(link), message, allreduces_per_step(c.num_hidden_layers)


def tensor_parallel_bill(model: ModelConfig | str | Mapping, batch: int, link: Link | str = "NVLink H100",
                         bytes_per_number: float = 2, world_size: int = 8, algorithm: str = "simple",
                         latency_s: float | None = None) -> CommBill:
    """The all-reduce bill of one decode step of ``batch`` people under tensor splitting.

    ``2 x num_hidden_layers`` all-reduces, each of ``batch x hidden_size x
    bytes_per_number`` bytes. Activations travel in 16 bits (``bytes_per_number=2``)
    even when the weights are stored in 8.
    """
    link, message, count = _tensor_parallel_step(model, batch, link, bytes_per_number)
    each = allreduce_seconds(message, link, world_size, algorithm, latency_s)
    fixed = allreduce_seconds(0, link, world_size, algorithm, latency_s)
    return CommBill(message_bytes=message, count=count, link=link.name, algorithm=algorithm,
                    seconds_each=each, latency_each=fixed)


# ---------------------------------------------------------------------------
# NCCL's cost model for an all-reduce inside one NVLink server
# ---------------------------------------------------------------------------

#: NCCL schedules priced by :func:`nccl_allreduce_seconds`: a ring with the LL
#: protocol (small messages), a ring with the Simple protocol (large ones), and
#: in-switch reduction (NVLS, NVLink SHARP).
NCCL_SCHEDULES = ("ring-ll", "ring-simple", "nvls")


def nccl_allreduce_latency_s(world_size: int, schedule: str = "ring-ll") -> float:
    """Fixed cost of one all-reduce inside one NVLink server, by NCCL's cost model.

    NCCL (``src/graph/tuning.cc``) charges a ring all-reduce over ``p`` GPUs a
    base latency once plus a per-step NVLink latency for each of its
    ``2 (p - 1)`` steps; in-switch reduction (NVLS) a flat latency. Constants
    from :mod:`servelab.sources` (``nccl_*``). NCCL's protocol bandwidth factors
    are not modelled: :func:`nccl_allreduce_seconds` adds the textbook bytes.
    """
    p = _positive_int("world_size", world_size)
    if schedule not in NCCL_SCHEDULES:
        raise ValueError(f"schedule must be one of {NCCL_SCHEDULES}, got {schedule!r}")
    if p == 1:
        return 0.0
    if schedule == "nvls":
        return sources.value("nccl_nvls_latency_us") * US
    proto = schedule.split("-")[1]
    base = sources.value(f"nccl_ring_base_latency_{proto}_us")
    hop = sources.value(f"nccl_ring_hop_latency_{proto}_us")
    return (base + 2 * (p - 1) * hop) * US


def nccl_allreduce_seconds(nbytes: float, link: Link | str, world_size: int = 8,
                           schedule: str = "ring-ll") -> float:
    """One all-reduce: NCCL's fixed cost (:func:`nccl_allreduce_latency_s`) plus bytes over ``link``.

    A ring sends ``2 (p - 1) / p`` of the message per GPU; in-switch reduction
    sends it once (the switch adds). Pass the one-way link (:func:`one_way`)
    for NVLink, whose headline counts both directions.
    """
    link = get_link(link)
    _non_negative("nbytes", nbytes)
    p = _positive_int("world_size", world_size)
    fixed = nccl_allreduce_latency_s(p, schedule)
    if p == 1:
        return 0.0
    share = 1.0 if schedule == "nvls" else 2 * (p - 1) / p
    return fixed + share * nbytes / link.bandwidth


def nccl_bill(model: ModelConfig | str | Mapping, batch: int, link: Link | str, world_size: int = 8,
              schedule: str = "ring-ll", bytes_per_number: float = 2) -> CommBill:
    """:func:`tensor_parallel_bill` priced by NCCL's cost model (``algorithm`` names the schedule)."""
    link, message, count = _tensor_parallel_step(model, batch, link, bytes_per_number)
    each = nccl_allreduce_seconds(message, link, world_size, schedule)
    return CommBill(message_bytes=message, count=count, link=link.name, algorithm=f"nccl {schedule}",
                    seconds_each=each, latency_each=nccl_allreduce_latency_s(world_size, schedule))


# ---------------------------------------------------------------------------
# pipelines and per-chip bytes
# ---------------------------------------------------------------------------

def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a fill-and-drain pipeline: ``(p - 1) / (m + p - 1)``.

    With ``p`` equal stages and ``m`` micro-batches the run takes ``m + p - 1``
    stage-times; each stage works ``m`` of them, so ``p - 1`` are idle.
    """
    p = _positive_int("stages", stages)
    m = _positive_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def pipeline_span(stages: int, microbatches: int, stage_seconds: float) -> float:
    """Wall time of a fill-and-drain pipeline of equal stages: ``(m + p - 1) * t``."""
    p = _positive_int("stages", stages)
    m = _positive_int("microbatches", microbatches)
    return (m + p - 1) * _positive("stage_seconds", stage_seconds)


def weight_bytes_per_chip(weight_bytes: float, chips: int, mode: str = "tensor") -> dict:
    """Bytes each chip stores and reads per decode step when ``chips`` split a model.

    Both kinds of splitting divide what each chip *stores*. Tensor splitting also
    divides what each chip reads per step, and all chips read at once, so the
    step's reading time falls by ``chips``. Pipeline splitting runs the stages one
    after the other for one token: each chip reads its share, but the token waits
    for all of them in turn, so the step's reading time stays that of the whole model.
    Returns ``stored``, ``read_per_chip`` and ``read_in_series`` (bytes whose
    reading time adds up along one token's path).
    """
    _positive("weight_bytes", weight_bytes)
    _positive_int("chips", chips)
    if mode not in ("tensor", "pipeline"):
        raise ValueError(f"mode must be 'tensor' or 'pipeline', got {mode!r}")
    share = weight_bytes / chips
    in_series = share if mode == "tensor" else weight_bytes
    return {"stored": share, "read_per_chip": share, "read_in_series": in_series}


def text_bytes(tokens: int, bytes_per_token: float = BYTES_PER_TOKEN_ENGLISH) -> float:
    """Bytes of text a streamed answer of ``tokens`` tokens carries (before HTTP framing)."""
    _non_negative("tokens", tokens)
    return tokens * _positive("bytes_per_token", bytes_per_token)


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """Least-squares fit of ``seconds = alpha + nbytes / bandwidth``; returns ``(alpha, bandwidth)``.

    Feed it measured (size, time) pairs of one collective; ``alpha`` is the fixed
    cost per call and ``bandwidth`` the bytes per second the slope implies.
    """
    xs, ys = [float(x) for x in nbytes], [float(y) for y in seconds]
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need at least two (nbytes, seconds) pairs of equal length, got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 2:
        raise ValueError("need at least two different message sizes to fit a slope")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        raise ValueError("the times do not grow with the size; measure larger messages")
    return my - slope * mx, 1 / slope
