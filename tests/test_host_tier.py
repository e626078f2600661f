"""The host tier's LRU order on its own: a store or a load makes a hash the most recently used, and a full tier
hands out the slot of the least recently used hash."""

from minipic_lite.host_tier import HostTier


def test_a_full_host_tier_evicts_its_least_recently_stored_hash():
    host = HostTier(2)
    assert (host.store(b"a"), host.store(b"b")) == (0, 1)
    assert host.store(b"c") == 0  # "a" is the oldest: its slot goes
    assert b"a" not in host and b"b" in host and b"c" in host
    host.check_integrity()


def test_storing_a_hash_again_makes_it_the_most_recent():
    host = HostTier(2)
    host.store(b"a"), host.store(b"b")
    assert host.store(b"a") is None  # here already: no copy
    assert host.store(b"c") == 1  # now "b" is the oldest
    assert b"b" not in host and b"a" in host
    host.check_integrity()


def test_loading_a_hash_makes_it_the_most_recent():
    host = HostTier(2)
    host.store(b"a"), host.store(b"b")
    assert host.load(b"a") == 0
    assert host.store(b"c") == 1  # "b" goes, not the "a" just loaded
    assert b"b" not in host and b"a" in host and host.num_loaded == 1 and host.num_stored == 3
    host.check_integrity()


def test_a_reset_tier_forgets_every_hash_and_hands_out_all_its_slots_again():
    """After a failed step the host copies are of unknown contents: reset() drops every hash, and the slots are
    free again, handed out from slot 0 as in a fresh tier."""
    host = HostTier(2)
    host.store(b"a"), host.store(b"b")
    host.reset()
    assert b"a" not in host and b"b" not in host
    assert (host.store(b"c"), host.store(b"d")) == (0, 1)  # both slots free again, none holds a stale hash
    assert b"a" not in host and b"c" in host and b"d" in host
    host.check_integrity()


def test_a_host_tier_of_one_slot_hands_that_slot_to_each_new_hash():
    """One slot is the smallest tier (only 0 or fewer are refused): each new hash takes slot 0 from the hash before
    it, unless that one is pinned by the admission loading it from there (then no copy is made)."""
    host = HostTier(1)
    assert host.store(b"a") == 0
    assert host.store(b"b") == 0 and b"a" not in host and b"b" in host
    host.pinned = {b"b"}
    assert host.store(b"c") is None and b"b" in host and b"c" not in host
    assert host.num_stored == 2
    host.check_integrity()
