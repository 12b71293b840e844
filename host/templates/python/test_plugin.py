from sharehost_guest import accept, reject, testing
from plugin import {{type}}


def test_rejects_tombstones_and_large_values():
    p = testing.instantiate({{type}}, {"max-bytes": "3"})
    assert p.handle(testing.records(b"abc", b"abcd", None)) == [
        accept(), reject("4 bytes > 3"), reject("tombstone")]
