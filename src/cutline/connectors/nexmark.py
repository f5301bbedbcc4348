"""Nexmark: the online-auction benchmark's event generator (persons, auctions, bids).

The event mix and field distributions follow the reference generator (Apache Beam's
``NexmarkGenerator``, Flink's nexmark ``GeneratorConfig``): in every 50 events 1 person, 3
auctions and 46 bids; ids start at 1000 (persons, auctions) and 10 (categories, 5 of them);
bids go to a hot auction with probability 1 - 1/2 and come from a hot bidder with
probability 1 - 1/4, auctions from a hot seller with probability 1 - 1/4 (the first of each
batch of the last 100 persons / auctions), the others to one of the last 100 auctions in
flight or 1000 active people (plus a lead of 10 not created yet); prices ``10**(6u) * 100``
cents; an auction lasts on average until 100 more auctions have been created; ``extra``
pads each event to 200 / 500 / 100 bytes on average.

What differs from the reference, on purpose:

- **Deterministic from (seed, event number) alone.**  The reference draws from an unseeded
  ``java.util.Random`` (Flink) or one seeded by the event id (Beam); here every field comes
  from a counter-based hash (splitmix64) of the seed, the event id and the field's slot, so
  event ``i`` is computed without the events before it: a source can start, restore or be
  split anywhere with exact positions.  Strings are slices of fixed pseudo-random pools
  (lower-case letters; names and descriptions with a space in 13, trimmed as the
  reference's ``nextString``) rather than drawn a character at a time.
- **Vectorised.**  A batch of event numbers is generated with numpy at once, as Python dict
  records (:meth:`Nexmark.records`) or an Arrow record batch (:meth:`Nexmark.batch`, the
  columnar path and the Parquet writer); both carry the same values.
- Bids have no ``channel`` / ``url`` (added in later Flink versions for queries 14-22).

Event time: event number ``n`` (after the out-of-order shuffle) happens at ``base_time_ms +
n * 1e6 / events_per_second`` microseconds, in whole milliseconds, regardless of how fast
the events are actually emitted (``rate=`` of the source limits that).  ``out_of_order``
> 1 permutes the events within consecutive groups of that many (the reference's
``outOfOrderGroupSize``): event times are then out of order by less than
:attr:`NexmarkConfig.max_delay` seconds, the bound to give ``assign_timestamps``.

Records (dicts, the shape of Flink nexmark's ``datagen`` table and of the files
``cutline nexmark generate`` writes): ``{"event_type": 0 | 1 | 2, "person": {...} | None,
"auction": {...} | None, "bid": {...} | None}``, times in epoch milliseconds:

- person: ``id, name, emailAddress, creditCard, city, state, dateTime, extra``
- auction: ``id, itemName, description, initialBid, reserve, dateTime, expires, seller,
  category, extra``
- bid: ``auction, bidder, price, dateTime, extra``
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .generator import GeneratorSource

__all__ = ["AUCTION", "BID", "PERSON", "Nexmark", "NexmarkConfig", "NexmarkSource",
           "event_time", "schema", "write_events"]

PERSON, AUCTION, BID = 0, 1, 2
KINDS = ("person", "auction", "bid")

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = HOT_AUCTION_RATIO = HOT_BIDDER_RATIO = 100  # "batch of the last 100"

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")

PERSON_FIELDS = ("id", "name", "emailAddress", "creditCard", "city", "state", "dateTime",
                 "extra")
AUCTION_FIELDS = ("id", "itemName", "description", "initialBid", "reserve", "dateTime",
                  "expires", "seller", "category", "extra")
BID_FIELDS = ("auction", "bidder", "price", "dateTime", "extra")


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters; the defaults are the reference's (Flink nexmark)."""

    seed: int = 0
    events_per_second: float = 10_000.0  # of event time (the reference's firstEventRate)
    base_time_ms: int = 1_436_918_400_000  # 2015-07-15, the reference's base time
    out_of_order: int = 1  # events are shuffled within groups of this many
    first_event_id: int = 0
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "events_per_second":
                if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                        and 0 < v < 1e9):
                    raise ValueError(f"NexmarkConfig.events_per_second must be a number "
                                     f"> 0 (events per second of event time), got {v!r}")
                continue
            least = 0 if f.name in ("seed", "first_event_id", "base_time_ms") or \
                f.name.startswith("avg_") else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ValueError(f"NexmarkConfig.{f.name} must be a whole number >= "
                                 f"{least}, got {v!r}")
        if self.out_of_order % 953 == 0:
            raise ValueError("NexmarkConfig.out_of_order must not be a multiple of 953 (the "
                             "shuffle multiplies by 953 modulo the group size)")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def delay_us(self) -> float:
        """Event time between consecutive events, microseconds."""
        return 1e6 / self.events_per_second

    @property
    def max_delay(self) -> float:
        """Seconds by which event times can be out of order (0 when ``out_of_order`` is 1):
        give it to ``assign_timestamps(max_delay=...)`` / Spark's ``withWatermark``."""
        if self.out_of_order == 1:
            return 0.0
        return (int((self.out_of_order - 1) * self.delay_us) // 1000 + 1) / 1000


# --------------------------------------------------------------------------- randomness

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix_int(z: int) -> int:
    """splitmix64's finaliser on a Python int."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _np() -> Any:
    import numpy as np

    return np


def _mix(z: Any) -> Any:
    """splitmix64's finaliser on a numpy uint64 array (multiplication wraps)."""
    np = _np()
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class _Draws:
    """Independent 64-bit draws per event: draw ``k`` of event ``id`` is a hash of (seed,
    id, k), so any field of any event is computed alone."""

    def __init__(self, seed: int, ids: Any) -> None:
        np = _np()
        salt = np.uint64(_mix_int(seed * 0xD1B54A32D192ED03 + 0x6E65786D61726B))
        with np.errstate(over="ignore"):
            self.base = _mix(ids.astype(np.uint64) * np.uint64(_GAMMA) + salt)

    def raw(self, k: int) -> Any:
        np = _np()
        with np.errstate(over="ignore"):
            return _mix(self.base + np.uint64(((k + 1) * _GAMMA) & _M64))

    def below(self, k: int, n: Any) -> Any:
        """Uniform in ``[0, n)`` (``n`` a positive int or int64 array)."""
        np = _np()
        n = np.asarray(n).astype(np.uint64)
        return (self.raw(k) % n).astype(np.int64)

    def uniform(self, k: int) -> Any:
        """Uniform in ``[0, 1)``."""
        np = _np()
        return (self.raw(k) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_POOL_SIZE = 1 << 16


class _Pool:
    """A fixed pseudo-random text (lower-case letters, ``spaces``: a space in 13) that
    strings are sliced from."""

    def __init__(self, key: int, spaces: bool) -> None:
        np = _np()
        draws = _Draws(key, np.arange(_POOL_SIZE, dtype=np.int64)).raw(0)
        chars = (np.uint64(ord("a")) + draws % np.uint64(26)).astype(np.uint8)
        if spaces:
            chars[(draws >> np.uint64(32)) % np.uint64(13) == 0] = ord(" ")
        self.bytes = chars
        self.text = chars.tobytes().decode("ascii")
        if spaces:  # trimming: the first letter at or after j, the last at or before j
            letter = chars != ord(" ")
            idx = np.arange(_POOL_SIZE)
            last = np.where(letter, idx, -1)
            self.prev = np.maximum.accumulate(last)
            first = np.where(letter, idx, _POOL_SIZE)
            self.next = np.minimum.accumulate(first[::-1])[::-1]


_POOLS: dict[str, _Pool] = {}


def _pool(name: str) -> _Pool:
    if name not in _POOLS:
        _POOLS[name] = _Pool(0x5E + len(name), spaces=name == "spaced")
    return _POOLS[name]


def _next_string(d: _Draws, k: int, max_length: int) -> tuple[Any, Any]:
    """The reference's ``nextString(maxLength)``: 3 to ``max_length - 1`` characters, a space
    in 13, trimmed; as (start, end) in the spaced pool (draws ``k``, ``k + 1``)."""
    np = _np()
    pool = _pool("spaced")
    length = 3 + d.below(k, max_length - 3)
    start = d.below(k + 1, _POOL_SIZE - length)
    s, e = pool.next[start], pool.prev[start + length - 1] + 1
    empty = s >= e
    return np.where(empty, start, s), np.where(empty, start, e)


def _next_extra(d: _Draws, k: int, current: Any, average: int) -> tuple[Any, Any]:
    """The reference's ``nextExtra``: letters making ``current + len`` ``average`` on average
    (draws ``k``, ``k + 1``), as (start, end) in the letters pool."""
    np = _np()
    want = np.maximum(average - np.asarray(current, dtype=np.int64), 0)
    delta = np.floor(want * 0.2 + 0.5).astype(np.int64)
    length = want - delta + d.below(k, np.maximum(2 * delta, 1)) * (delta > 0)
    start = d.below(k + 1, _POOL_SIZE - length)
    return start, start + length


def _price(d: _Draws, k: int) -> Any:
    np = _np()
    return np.floor(np.power(10.0, d.uniform(k) * 6.0) * 100.0 + 0.5).astype(np.int64)


# --------------------------------------------------------------------------- the generator


class Nexmark:
    """Events by number: ``records(numbers)`` (dicts) or ``batch(numbers)`` (Arrow)."""

    def __init__(self, config: NexmarkConfig | None = None) -> None:
        self.config = config or NexmarkConfig()

    # -------------------------------------------------------------- numbering

    def _adjusted(self, numbers: Any) -> Any:
        """The out-of-order shuffle (the reference's ``nextAdjustedEventNumber``)."""
        n = self.config.out_of_order
        if n == 1:
            return numbers
        return (numbers // n) * n + (numbers * 953) % n

    def _timestamp(self, adjusted: Any) -> Any:
        np = _np()
        c = self.config
        return c.base_time_ms + (adjusted * c.delay_us).astype(np.int64) // 1000

    def _last_person(self, ids: Any) -> Any:
        c = self.config
        epoch, offset = ids // c.total_proportion, ids % c.total_proportion
        return epoch * c.person_proportion + _np().minimum(offset, c.person_proportion - 1)

    def _last_auction(self, ids: Any) -> Any:
        np = _np()
        c = self.config
        epoch, offset = ids // c.total_proportion, ids % c.total_proportion
        person = offset < c.person_proportion
        bid = offset >= c.person_proportion + c.auction_proportion
        epoch = epoch - person
        offset = np.where(person | bid, c.auction_proportion - 1, offset - c.person_proportion)
        return epoch * c.auction_proportion + offset

    def _some_person(self, d: _Draws, k: int, ids: Any) -> Any:
        """A random active person, base 0 (``nextBase0PersonId``)."""
        np = _np()
        people = self._last_person(ids) + 1
        active = np.minimum(people, self.config.num_active_people)
        return people - active + d.below(k, active + PERSON_ID_LEAD)

    def _some_auction(self, d: _Draws, k: int, ids: Any) -> Any:
        """A random auction in flight, base 0 (``nextBase0AuctionId``)."""
        np = _np()
        last = self._last_auction(ids)
        first = np.maximum(last - self.config.num_in_flight_auctions, 0)
        return first + d.below(k, last - first + 1 + AUCTION_ID_LEAD)

    # -------------------------------------------------------------- columns

    def columns(self, numbers: Any) -> dict:
        """Every field of events ``numbers`` (an int64 array of event numbers), as numpy
        arrays per kind: ``{"kind": ..., "person": {"rows": positions, field: values,
        ...}, ...}``; strings are (start, end) pairs into the pools."""
        np = _np()
        c = self.config
        numbers = np.asarray(numbers, dtype=np.int64)
        adjusted = self._adjusted(numbers)
        ids = c.first_event_id + adjusted
        rem = ids % c.total_proportion
        kind = np.where(rem < c.person_proportion, PERSON,
                        np.where(rem < c.person_proportion + c.auction_proportion, AUCTION,
                                 BID)).astype(np.int32)
        ts = self._timestamp(adjusted)
        out: dict[str, Any] = {"kind": kind}
        for k, name in enumerate(KINDS):
            rows = np.flatnonzero(kind == k)
            cols: dict[str, Any] = {"rows": rows}
            if len(rows):
                getattr(self, f"_{name}")(cols, _Draws(c.seed, ids[rows]), ids[rows],
                                          adjusted[rows], ts[rows])
            out[name] = cols
        return out

    def _person(self, cols: dict, d: _Draws, ids: Any, adjusted: Any, ts: Any) -> None:
        np = _np()
        c = self.config
        cols["id"] = self._last_person(ids) + FIRST_PERSON_ID
        cols["first"] = d.below(0, len(FIRST_NAMES))
        cols["last"] = d.below(1, len(LAST_NAMES))
        cols["email1"] = _next_string(d, 2, 7)
        cols["email2"] = _next_string(d, 4, 5)
        cols["card"] = [d.below(6 + j, 10_000) for j in range(4)]
        cols["city"] = d.below(10, len(US_CITIES))
        cols["state"] = d.below(11, len(US_STATES))
        cols["dateTime"] = ts
        name_len = (np.array([len(n) for n in FIRST_NAMES])[cols["first"]] + 1
                    + np.array([len(n) for n in LAST_NAMES])[cols["last"]])
        email_len = (cols["email1"][1] - cols["email1"][0] + 1
                     + cols["email2"][1] - cols["email2"][0] + 4)
        size = (8 + name_len + email_len + 19
                + np.array([len(n) for n in US_CITIES])[cols["city"]] + 2)
        cols["extra"] = _next_extra(d, 12, size, c.avg_person_bytes)

    def _auction(self, cols: dict, d: _Draws, ids: Any, adjusted: Any, ts: Any) -> None:
        np = _np()
        c = self.config
        cols["id"] = self._last_auction(ids) + FIRST_AUCTION_ID
        hot = d.below(0, c.hot_sellers_ratio) > 0
        hot_seller = (self._last_person(ids) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        cols["seller"] = np.where(hot, hot_seller, self._some_person(d, 1, ids)) \
            + FIRST_PERSON_ID
        cols["category"] = FIRST_CATEGORY_ID + d.below(2, NUM_CATEGORIES)
        cols["initialBid"] = _price(d, 3)
        ahead = (c.num_in_flight_auctions * c.total_proportion) // c.auction_proportion
        horizon = self._timestamp(adjusted + ahead) - ts
        cols["expires"] = ts + 1 + d.below(4, np.maximum(horizon * 2, 1))
        cols["itemName"] = _next_string(d, 5, 20)
        cols["description"] = _next_string(d, 7, 100)
        cols["reserve"] = cols["initialBid"] + _price(d, 9)
        cols["dateTime"] = ts
        size = (8 + cols["itemName"][1] - cols["itemName"][0]
                + cols["description"][1] - cols["description"][0] + 40)
        cols["extra"] = _next_extra(d, 10, size, c.avg_auction_bytes)

    def _bid(self, cols: dict, d: _Draws, ids: Any, adjusted: Any, ts: Any) -> None:
        np = _np()
        c = self.config
        hot = d.below(0, c.hot_auction_ratio) > 0
        hot_auction = (self._last_auction(ids) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        cols["auction"] = np.where(hot, hot_auction, self._some_auction(d, 1, ids)) \
            + FIRST_AUCTION_ID
        hot = d.below(2, c.hot_bidders_ratio) > 0
        hot_bidder = (self._last_person(ids) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
        cols["bidder"] = np.where(hot, hot_bidder, self._some_person(d, 3, ids)) \
            + FIRST_PERSON_ID
        cols["price"] = _price(d, 4)
        cols["dateTime"] = ts
        cols["extra"] = _next_extra(d, 5, 32, c.avg_bid_bytes)

    # -------------------------------------------------------------- records

    def records(self, numbers: Any) -> list[dict]:
        """Events ``numbers`` as dict records."""
        cols = self.columns(numbers)
        out: list[Any] = [None] * len(cols["kind"])
        for k, name in enumerate(KINDS):
            c = cols[name]
            if not len(c["rows"]):
                continue
            values = getattr(self, f"_{name}_values")(c)
            if k == BID:
                events = [{"event_type": BID, "person": None, "auction": None, "bid": v}
                          for v in values]
            else:
                events = [{"event_type": k, "person": v if k == PERSON else None,
                           "auction": v if k == AUCTION else None, "bid": None}
                          for v in values]
            for pos, e in zip(c["rows"].tolist(), events):
                out[pos] = e
        return out

    @staticmethod
    def _text(pool: str, span: tuple[Any, Any]) -> list[str]:
        text = _pool(pool).text
        return [text[s:e] for s, e in zip(span[0].tolist(), span[1].tolist())]

    def _person_values(self, c: dict) -> list[dict]:
        names = [f"{FIRST_NAMES[a]} {LAST_NAMES[b]}"
                 for a, b in zip(c["first"].tolist(), c["last"].tolist())]
        emails = [f"{a}@{b}.com" for a, b in zip(self._text("spaced", c["email1"]),
                                                 self._text("spaced", c["email2"]))]
        cards = [f"{a:04d} {b:04d} {x:04d} {y:04d}"
                 for a, b, x, y in zip(*(g.tolist() for g in c["card"]))]
        cities = [US_CITIES[i] for i in c["city"].tolist()]
        states = [US_STATES[i] for i in c["state"].tolist()]
        return [dict(zip(PERSON_FIELDS, row)) for row in zip(
            c["id"].tolist(), names, emails, cards, cities, states, c["dateTime"].tolist(),
            self._text("letters", c["extra"]))]

    def _auction_values(self, c: dict) -> list[dict]:
        return [dict(zip(AUCTION_FIELDS, row)) for row in zip(
            c["id"].tolist(), self._text("spaced", c["itemName"]),
            self._text("spaced", c["description"]), c["initialBid"].tolist(),
            c["reserve"].tolist(), c["dateTime"].tolist(), c["expires"].tolist(),
            c["seller"].tolist(), c["category"].tolist(), self._text("letters", c["extra"]))]

    def _bid_values(self, c: dict) -> list[dict]:
        return [{"auction": a, "bidder": b, "price": p, "dateTime": t, "extra": x}
                for a, b, p, t, x in zip(c["auction"].tolist(), c["bidder"].tolist(),
                                         c["price"].tolist(), c["dateTime"].tolist(),
                                         self._text("letters", c["extra"]))]

    def event(self, number: int) -> dict:
        """Event ``number`` as a dict record."""
        return self.records([number])[0]

    # -------------------------------------------------------------- Arrow

    def batch(self, numbers: Any) -> Any:
        """Events ``numbers`` as a ``pyarrow.RecordBatch`` with :func:`schema`: the same
        values as :meth:`records` (the columnar path; Parquet files)."""
        import pyarrow as pa

        np = _np()
        cols = self.columns(numbers)
        n = len(cols["kind"])
        arrays = [pa.array(cols["kind"], pa.int32())]
        sch = schema()
        for name in KINDS:
            c = cols[name]
            rows = c["rows"]
            # where each event's row of this kind is: a null (index len(rows)) elsewhere
            take = np.full(n, len(rows), dtype=np.int64)
            take[rows] = np.arange(len(rows))
            struct_type = sch.field(name).type
            children = getattr(self, f"_{name}_arrays")(c) if len(rows) else [
                pa.array([], struct_type.field(j).type) for j in range(struct_type.num_fields)]
            inner = pa.StructArray.from_arrays(children, fields=list(struct_type))
            padded = pa.concat_arrays([inner, pa.nulls(1, struct_type)])
            arrays.append(padded.take(pa.array(take)))
        return pa.RecordBatch.from_arrays(arrays, schema=sch)

    @staticmethod
    def _string_array(pool: str, span: tuple[Any, Any]) -> Any:
        import pyarrow as pa

        np = _np()
        start, end = span
        lengths = (end - start).astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        idx = np.repeat(start - offsets[:-1], lengths) + np.arange(offsets[-1])
        data = _pool(pool).bytes[idx]
        return pa.LargeStringArray.from_buffers(
            len(lengths), pa.py_buffer(offsets), pa.py_buffer(data)).cast(pa.string())

    def _person_arrays(self, c: dict) -> list:
        import pyarrow as pa

        v = self._person_values(c)  # persons are 2 % of events: dicts are cheap enough
        return [pa.array([r[f] for r in v], schema().field("person").type.field(f).type)
                for f in PERSON_FIELDS]

    def _auction_arrays(self, c: dict) -> list:
        import pyarrow as pa

        s = self._string_array
        return [pa.array(c["id"]), s("spaced", c["itemName"]), s("spaced", c["description"]),
                pa.array(c["initialBid"]), pa.array(c["reserve"]), pa.array(c["dateTime"]),
                pa.array(c["expires"]), pa.array(c["seller"]), pa.array(c["category"]),
                s("letters", c["extra"])]

    def _bid_arrays(self, c: dict) -> list:
        import pyarrow as pa

        return [pa.array(c["auction"]), pa.array(c["bidder"]), pa.array(c["price"]),
                pa.array(c["dateTime"]), self._string_array("letters", c["extra"])]


_SCHEMA: Any = None


def schema() -> Any:
    """The Arrow schema of Nexmark events (Flink nexmark's ``datagen`` table)."""
    global _SCHEMA
    if _SCHEMA is None:
        import pyarrow as pa

        i64, s = pa.int64(), pa.string()
        types = {"id": i64, "name": s, "emailAddress": s, "creditCard": s, "city": s,
                 "state": s, "dateTime": i64, "extra": s, "itemName": s, "description": s,
                 "initialBid": i64, "reserve": i64, "expires": i64, "seller": i64,
                 "category": i64, "auction": i64, "bidder": i64, "price": i64}
        _SCHEMA = pa.schema(
            [("event_type", pa.int32())]
            + [(name, pa.struct([(f, types[f]) for f in names])) for name, names in
               zip(KINDS, (PERSON_FIELDS, AUCTION_FIELDS, BID_FIELDS))])
    return _SCHEMA


def spark_schema() -> str:
    """The same schema as a Spark DDL string (``spark.readStream.schema(...)``)."""
    import pyarrow as pa

    def ddl(t: Any) -> str:
        if pa.types.is_struct(t):
            return "struct<" + ", ".join(f"{f.name}: {ddl(f.type)}" for f in t) + ">"
        return {"int32": "int", "int64": "bigint", "string": "string"}[str(t)]

    return ", ".join(f"{f.name} {ddl(f.type)}" for f in schema())


def event_time(e: dict) -> float:
    """A Nexmark record's event time in seconds (``assign_timestamps(event_time, ...)``)."""
    return e[KINDS[e["event_type"]]]["dateTime"] / 1000


# --------------------------------------------------------------------------- the source


def _nothing(i: int) -> None:  # GeneratorSource's fn is unused: records come in batches
    raise AssertionError("NexmarkSource generates its records in batches")


class NexmarkSource(GeneratorSource):
    """Nexmark events ``0 .. count - 1`` (``count=None``: unbounded) as dict records, or
    with ``batches=True`` as Arrow record batches of :func:`schema` (a batch stream).

    A :class:`GeneratorSource`: subtask ``s`` of ``p`` emits the events ``i % p == s`` in
    order, the position is the next event number, so replay after a restore is exact and a
    rescale shares the remaining numbers out; ``rate`` caps the events/s over all subtasks
    (wall clock; event time is ``config.events_per_second`` regardless).
    """

    def __init__(self, count: int | None = None, rate: float | None = None,
                 config: NexmarkConfig | None = None, *, batches: bool = False,
                 batch_rows: int = 8192, name: str = "nexmark", step: float = 0.05) -> None:
        self.config = config or NexmarkConfig()
        self.generator = Nexmark(self.config)
        super().__init__(count=count, rate=rate, fn=_nothing, name=name, step=step,
                         batch_fn=self.generator.batch if batches else None,
                         batch_rows=batch_rows)

    def records(self, start: int, stride: int, n: int) -> list:
        if not n:
            return []
        return self.generator.records(_np().arange(start, start + n * stride, stride,
                                                   dtype=_np().int64))

    def __repr__(self) -> str:
        return (f"NexmarkSource(count={self.count}, rate={self.rate}, "
                f"config={self.config!r}, batches={self.columnar})")


# --------------------------------------------------------------------------- files


def write_events(out: str, events: int, *, format: str = "jsonl", files: int = 1,
                 config: NexmarkConfig | None = None, chunk: int = 65_536,
                 sentinel: bool = False) -> list[str]:
    """Write events ``0 .. events - 1`` to ``files`` files under directory ``out``
    (``events-00000.jsonl`` / ``.parquet``, in event order, modification times increasing
    so that Spark's file source reads them in order); returns their paths.

    ``sentinel``: one more file holding a single bid far in the future (a year after the
    last event), for Spark, whose windows close only when its watermark passes them: it
    closes every real window (cutline fires them all at the end of input anyway)."""
    import json
    import os
    import time

    np = _np()
    if format not in ("jsonl", "parquet"):
        raise ValueError(f"format must be 'jsonl' or 'parquet', got {format!r}")
    if not isinstance(events, int) or events < 0:
        raise ValueError(f"events must be a whole number >= 0, got {events!r}")
    if not isinstance(files, int) or files < 1:
        raise ValueError(f"files must be a whole number >= 1, got {files!r}")
    gen = Nexmark(config)
    os.makedirs(out, exist_ok=True)
    bounds = [events * k // files for k in range(files + 1)]
    paths = []
    parts: list[tuple[int, int] | None] = [(bounds[k], bounds[k + 1]) for k in range(files)]
    if sentinel:
        parts.append(None)
    now = time.time()
    for k, part in enumerate(parts):
        path = os.path.join(out, f"events-{k:05d}.{format}")
        tmp = os.path.join(out, f".events-{k:05d}.{format}.tmp")
        if part is None:
            chunks: Any = [None]
        else:
            chunks = [np.arange(a, min(a + chunk, part[1]), dtype=np.int64)
                      for a in range(part[0], part[1], chunk)]
        if format == "jsonl":
            with open(tmp, "w") as f:
                for numbers in chunks:
                    rows = [sentinel_bid(gen.config, events)] if numbers is None else \
                        gen.records(numbers)
                    f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            with pq.ParquetWriter(tmp, schema()) as w:
                for numbers in chunks:
                    if numbers is None:
                        w.write_batch(pa.RecordBatch.from_pylist(
                            [sentinel_bid(gen.config, events)], schema=schema()))
                    else:
                        w.write_batch(gen.batch(numbers))
        os.replace(tmp, path)
        os.utime(path, (now - len(parts) + k, now - len(parts) + k))
        paths.append(path)
    return paths


SENTINEL_AUCTION = -1


def sentinel_bid(config: NexmarkConfig, events: int) -> dict:
    """A bid a year after event ``events``: it moves a watermark past every real window.
    Its auction and bidder are ``-1``; queries' comparisons leave out what it makes."""
    ts = int(Nexmark(config)._timestamp(_np().array([events]))[0]) + 365 * 86_400_000
    return {"event_type": BID, "person": None, "auction": None,
            "bid": {"auction": SENTINEL_AUCTION, "bidder": SENTINEL_AUCTION, "price": 0,
                    "dateTime": ts, "extra": ""}}
