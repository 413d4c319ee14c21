"""carma_profile.allocator: the caching allocator's rules (block rounding, pools, segment
sizes, best fit, splitting, merging), each on a sequence small enough to follow by hand."""

from carma_profile.allocator import LARGE_BUFFER, SMALL_BUFFER, CachingAllocator, round_size, segment_size

MIB = 1 << 20


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(1 * MIB) == SMALL_BUFFER  # the small pool's 2 MiB segment
    assert segment_size(1 * MIB + 512) == LARGE_BUFFER  # 20 MiB for requests under 10 MiB
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(10 * MIB + 1) == 12 * MIB  # rounded up to 2 MiB


def test_small_requests_share_a_segment_and_large_ones_get_their_own():
    a = CachingAllocator()
    blocks = [a.malloc(100_000) for _ in range(4)]
    assert a.reserved == SMALL_BUFFER  # four 0.1 MB blocks split one 2 MiB segment
    big = a.malloc(50 * MIB)
    assert a.reserved == SMALL_BUFFER + 50 * MIB
    for b in blocks:
        a.free(b)
    a.free(big)
    assert a.allocated == 0 and a.reserved == SMALL_BUFFER + 50 * MIB  # segments are kept


def test_best_fit_reuses_the_smallest_cached_block_and_splits_it():
    a = CachingAllocator()
    x, y = a.malloc(40 * MIB), a.malloc(30 * MIB)
    a.free(x)
    a.free(y)
    z = a.malloc(25 * MIB)  # fits both; the 30 MiB block is the smaller
    assert a.reserved == 70 * MIB and z.addr == y.addr
    w = a.malloc(4 * MIB)  # the 5 MiB rest of that block is more than 1 MiB: it was split off
    assert a.reserved == 70 * MIB and w.addr == y.addr + 25 * MIB


def test_freed_neighbours_merge_and_a_fragmented_segment_forces_a_new_one():
    a = CachingAllocator()
    x = a.malloc(64 * MIB)
    a.free(x)
    parts = [a.malloc(16 * MIB) for _ in range(4)]  # the 64 MiB segment split in four
    assert a.reserved == 64 * MIB
    a.free(parts[0])
    a.free(parts[2])
    # 32 MiB are free but in two pieces: a 20 MiB request cannot use them
    a.malloc(20 * MIB)
    assert a.reserved == 84 * MIB
    a.free(parts[1])  # now parts 0-2 merge into one 48 MiB block
    c = a.malloc(40 * MIB)
    assert a.reserved == 84 * MIB and c.addr == parts[0].addr
