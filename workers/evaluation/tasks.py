"""Fact-finding tasks over real passages, the documents as chunks, after RULER's (Hsieh et al., 2024) definitions.

Each instance is a QA record (`id`, `question`, `answers`, `documents`) that `blendserve eval` reads as it
reads the shared QA files: `num_chunks` documents of real passages (the haystack) about `context_tokens`
long in all, with the task's facts written into them at a chosen depth. Families:

- `single_fact`: RULER's single needle, "One of the special magic numbers for KEY is: VALUE.", asked by key;
- `multi_key`: the same with `num_distractors` needles of other keys in other chunks (RULER's multi-key);
- `chain`: RULER's variable tracking, one hop: `VAR A = VALUE` in one chunk, `VAR B = VAR A` in another, asked
  for the value of B (RULER asks which variables hold a value; asking for B's value keeps one exact answer);
- `reference`: a label in one chunk, its value in another ("NAME's office is room LABEL." and "The phone
  extension of room LABEL is VALUE."), asked for NAME's extension;
- `split_fact`: the single needle cut where a fixed-size chunker cuts text, between two chunks: "One of the
  special magic numbers for KEY is:" ends one chunk and "VALUE." starts the next, asked by key.

In `chain`, `reference` and `split_fact` the answer needs two chunks: a chunk's cached KV never saw the other one.
"""
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

FAMILIES = ("single_fact", "multi_key", "chain", "reference", "split_fact")
SPANNING = ("chain", "reference", "split_fact")  # the answer needs two chunks
PLACES = ("any", "start", "end")  # where in its chunk a fact sentence goes
ORDERS = ("forward", "backward")
_MAX_MISSES = 16  # filler sentences in a row that overflow a chunk's budget before it counts as full

CountTokens = Callable[[str], int]
"""Tokens of a text under the served model's tokenizer."""

# Keys and names are plain words (RULER draws keys from a word list); values are 7-digit numbers, as in RULER.
_WORDS = (
    "amber", "basin", "cedar", "delta", "ember", "fjord", "glade", "harbor", "island", "juniper", "kettle",
    "lantern", "meadow", "nectar", "orchid", "pebble", "quartz", "raven", "saddle", "thistle", "umber", "velvet",
    "willow", "yarrow", "zephyr", "anchor", "bramble", "copper", "dune", "falcon", "granite", "heron", "indigo",
    "jasper", "kelp", "lichen", "marble", "nutmeg", "opal", "prairie",
)
_NAMES = (
    "Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ingrid", "Jonas", "Keiko", "Luis",
    "Maya", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq", "Ursula", "Viktor", "Wen", "Yusuf",
)


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """One setting of a family: the knobs RULER varies, with the documents as chunks."""

    family: str
    num_chunks: int = 10
    context_tokens: int = 2000  # the documents' tokens in all (the haystack plus the facts)
    depth: float = 0.5  # where the asked fact's chunk sits: 0 the first chunk, 1 the last
    # chain, reference: the chunk that uses the fact after ("forward") or before it; split_fact reads forward
    order: str = "forward"
    num_distractors: int = 3  # multi_key: needles of other keys

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if not 2 <= self.num_chunks <= 64:
            raise ValueError(f"num_chunks must be in [2, 64], got {self.num_chunks}")
        if self.context_tokens < 32 * self.num_chunks:
            raise ValueError(f"context_tokens must be >= 32 per chunk, got {self.context_tokens}")
        if not 0.0 <= self.depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {self.depth}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if not 0 <= self.num_distractors < self.num_chunks:
            raise ValueError(f"num_distractors must be in [0, num_chunks), got {self.num_distractors}")

    @property
    def name(self) -> str:
        """A label for results: family and knobs."""
        return (f"{self.family}-k{self.num_chunks}-t{self.context_tokens}-d{self.depth:g}-{self.order}"
                f"{f'-x{self.num_distractors}' if self.family == 'multi_key' else ''}")


@dataclass(frozen=True, slots=True)
class Placed:
    """A fact sentence, the chunk it is written into and where in it."""

    chunk: int
    sentence: str
    at: str = "any"  # one of PLACES: a random sentence boundary, or the chunk's first or last words

    def __post_init__(self) -> None:
        if self.at not in PLACES:
            raise ValueError(f"at must be one of {PLACES}, got {self.at!r}")


def fact_chunk(settings: TaskSettings) -> int:
    """The chunk holding the asked fact (the value), by depth."""
    return round(settings.depth * (settings.num_chunks - 1))


def partner_chunk(settings: TaskSettings, rng: random.Random) -> int:
    """For a spanning family, the chunk that uses the fact: after it ("forward") or before it, where one exists."""
    anchor = fact_chunk(settings)
    after, before = range(anchor + 1, settings.num_chunks), range(anchor)
    side = after if settings.order == "forward" else before
    return rng.choice(side or (before if settings.order == "forward" else after))


def facts_of(settings: TaskSettings, rng: random.Random) -> tuple[list[Placed], str, str]:
    """The fact sentences to write (with their chunks), the question, and its one answer."""
    value = str(rng.randrange(1_000_000, 10_000_000))
    anchor = fact_chunk(settings)
    if settings.family not in SPANNING:
        keys = rng.sample(_WORDS, 1 + (settings.num_distractors if settings.family == "multi_key" else 0))
        placed = [Placed(anchor, _needle(keys[0], value))]
        others = rng.sample([c for c in range(settings.num_chunks) if c != anchor], len(keys) - 1)
        placed += [Placed(chunk, _needle(key, str(rng.randrange(1_000_000, 10_000_000))))
                   for chunk, key in zip(others, keys[1:])]
        return placed, f"What is the special magic number for {keys[0]} mentioned in the provided text?", value
    if settings.family == "split_fact":
        key, value_chunk = rng.choice(_WORDS), max(anchor, 1)  # the value's chunk at the depth, after the key's
        head, tail = _needle(key, value).rsplit(" ", 1)
        placed = [Placed(value_chunk - 1, head, "end"), Placed(value_chunk, tail, "start")]
        return placed, f"What is the special magic number for {key} mentioned in the provided text?", value
    partner = partner_chunk(settings, rng)
    if settings.family == "chain":
        first, second = ("".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5)) for _ in range(2))
        placed = [Placed(anchor, f"VAR {first} = {value}."), Placed(partner, f"VAR {second} = VAR {first}.")]
        return placed, f"What number is VAR {second} assigned in the text above?", value
    name, label = rng.choice(_NAMES), f"{rng.randrange(100, 1000)}{rng.choice('ABCDEFGH')}"
    placed = [Placed(anchor, f"The phone extension of room {label} is {value}."),
              Placed(partner, f"{name}'s office is room {label}.")]
    return placed, f"What is the phone extension of {name}'s office?", value


def make_instance(
    settings: TaskSettings, passages: Sequence[str], rng: random.Random, count_tokens: CountTokens, index: int
) -> dict:
    """One record: the haystack cut into chunks, each fact written at a sentence boundary of its chunk."""
    placed, question, answer = facts_of(settings, rng)
    budget = settings.context_tokens // settings.num_chunks
    documents = []
    for chunk in range(settings.num_chunks):
        facts = [p for p in placed if p.chunk == chunk]
        filler = _filler(passages, rng, budget - sum(count_tokens(p.sentence) + 1 for p in facts), count_tokens)
        documents.append(_insert(filler, facts, rng))
    return {
        "id": f"{settings.name}-{index}",
        "question": question,
        "answers": [answer],
        "documents": documents,
        "family": settings.family,
        "settings": asdict(settings),
    }


def make_tasks(
    settings: TaskSettings, passages: Sequence[str], num_instances: int, seed: int, count_tokens: CountTokens
) -> list[dict]:
    """`num_instances` records of one setting, reproducible from `seed`."""
    if num_instances < 1:
        raise ValueError(f"num_instances must be >= 1, got {num_instances}")
    if not passages:
        raise ValueError("need at least one passage for the haystack")
    rng = random.Random(f"{seed}:{settings.name}")
    return [make_instance(settings, passages, rng, count_tokens, index) for index in range(num_instances)]


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _filler(passages: Sequence[str], rng: random.Random, budget_tokens: int, count_tokens: CountTokens) -> list[str]:
    """Sentences of random passages, in passage order, filling `budget_tokens` (at least one sentence).

    A sentence that would overflow is skipped and later ones tried, until `_MAX_MISSES` in a row did not fit.
    """
    sentences: list[str] = []
    used = misses = 0
    while misses < _MAX_MISSES:
        for sentence in _sentences(passages[rng.randrange(len(passages))]):
            cost = count_tokens(sentence) + 1
            if sentences and used + cost > budget_tokens:
                misses += 1
                break
            sentences.append(sentence)
            used += cost
            misses = 0
    return sentences


def _sentences(passage: str) -> list[str]:
    """A passage split after each full stop that ends a sentence (abbreviations may split; filler only)."""
    parts = [part.strip() for part in passage.replace("\n", " ").split(". ")]
    return [part if part.endswith(".") else f"{part}." for part in parts if part]


def _insert(filler: list[str], facts: list[Placed], rng: random.Random) -> str:
    """The chunk's text: each fact sentence where it is placed, `any` at a random boundary between filler sentences."""
    text = list(filler)
    for fact in facts:
        where = {"start": 0, "end": len(text)}.get(fact.at)
        text.insert(rng.randrange(len(text) + 1) if where is None else where, fact.sentence)
    return " ".join(text)
