"""The one registry both families use (cache backends, allocators): names checked, taken names refused,
unknown names answered with the valid ones, listed in order."""

from __future__ import annotations

import pytest

from autotune import caches
from autotune._family import Family
from autotune.caches._family import register as register_backend
from autotune.errors import AutotuneError
from autotune.process._family import register as register_allocator


class First:
    name, order = "first", 1


class Zeroth:
    name, order = "zeroth", 0


def test_a_family_lists_in_order_and_names_the_valid_ones_for_an_unknown_name():
    family: Family[type] = Family("widget", "widgets", r"^[a-z]+$")
    family.add(First)
    family.add(Zeroth)
    family.add(First)  # the same class again is no conflict
    assert family.names() == ("zeroth", "first") and family.get("first") is First
    with pytest.raises(AutotuneError, match=r"^Unknown widget 'x'\. Valid widgets: zeroth, first\.$"):
        family.get("x")
    family.remove("first")
    assert family.names() == ("zeroth",)


def test_both_families_refuse_a_bad_or_taken_name_in_their_own_words():
    class Dashed:
        name, order = "mem-ory", 9

    class Taken:
        name, order = "memory", 9

    with pytest.raises(ValueError, match=r"^A cache backend's name must match .*, but Dashed has 'mem-ory'\.$"):
        register_backend(Dashed)  # type: ignore[type-var]
    with pytest.raises(ValueError, match=r"^The cache backend name 'memory' is taken by MemoryCache\.$"):
        register_backend(Taken)  # type: ignore[type-var]

    class Spaced:
        name, order, stand_in, libraries = "two words", 9, "glibc", ()

    with pytest.raises(ValueError, match=r"^An allocator's name must match .*, but Spaced has 'two words'\.$"):
        register_allocator(Spaced)  # type: ignore[type-var]
    with pytest.raises(AutotuneError, match=r"^Unknown cache backend 'nope'\. Valid backends: memory, pickle"):
        caches.get_backend("nope")
