"""The host tier: blocks evicted from the device cache, kept in host memory under the same block hashes.

    device pool evicts block b (hash h)  ->  copy b to a host slot, h -> slot      (LRU: the oldest slot goes)
    a later prompt misses h on the device ->  h is in the host tier: copy slot -> any free device block

Keys are stored unrotated (position-free), so a block comes back to any device block at any offset with no
RoPE fix-up. This class keeps the books only; the copies are `BlockCopy` records that the model runner
executes in order, before the step's forward (on CUDA from pinned memory, asynchronous to the host).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from minipic_lite.hashing import BlockHash


@dataclass(frozen=True, slots=True)
class BlockCopy:
    to_host: bool  # True: device block -> host slot (an eviction); False: host slot -> device block (a hit)
    block_id: int
    slot: int


class HostTier:
    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"the host tier needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self.reset()
        self.pinned: set[BlockHash] = set()  # hashes being loaded by the admission under way: never evicted
        self.num_stored = self.num_loaded = 0

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self.slots

    def store(self, block_hash: BlockHash) -> int | None:
        """A slot for an evicted block (the least recently used one's, when full); None: no copy (it is here
        already, or every slot is pinned)."""
        if block_hash in self.slots:  # NOTE: loaded from here earlier: no copy needed, just fresher
            self.slots.move_to_end(block_hash)
            return None
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            victim = next((h for h in self.slots if h not in self.pinned), None)
            if victim is None:
                return None
            slot = self.slots.pop(victim)
        self.slots[block_hash] = slot
        self.num_stored += 1
        return slot

    def load(self, block_hash: BlockHash) -> int:
        """The slot that holds `block_hash` (it stays, now most recent); counts a copy to the device."""
        self.slots.move_to_end(block_hash)
        self.num_loaded += 1
        return self.slots[block_hash]

    def reset(self) -> None:
        self.slots: OrderedDict[BlockHash, int] = OrderedDict()  # hash -> slot, least recently used first
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def check_integrity(self) -> None:
        """Each slot holds at most one hash; used + free slots == all slots."""
        used = list(self.slots.values())
        assert len(set(used)) == len(used), "a host slot holds two hashes"
        assert sorted(used + self.free_slots) == list(range(self.num_slots)), "host slots lost or doubled"
