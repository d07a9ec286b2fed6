"""basic_auth_users of a web configuration file: bcrypt-hashed passwords checked as
exporter-toolkit checks them (web/handler.go), one bcrypt at a time, with its cache of outcomes
(web/cache.go), so that a known scraper never waits for bcrypt behind a flood of guesses.

bcrypt is imported when a file has basic_auth_users: the exporter without them needs none.

May import ibtool.errors, and bcrypt; never another ibtool module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import random
import re
import threading

from ibtool.errors import UnsupportedError

# A bcrypt hash as Go's golang.org/x/crypto/bcrypt takes it: $2a$, $2b$ or $2y$ (the same
# algorithm), a two-digit cost, then 22 characters of salt and 31 of hash.
BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
# What an unknown user's password is checked against (web/handler.go does the same with a fixed
# cost-10 hash), at the cost of the configured hashes so that the time of a refusal does not
# tell whether the user exists. It matches no password: only the work counts.
DUMMY_HASH_BODY = "abcdefghijklmnopqrstuu" + "0123456789ABCDEFGHIJKLMNOPQRSTU"

_CACHE_SIZE = 100  # web/cache.go cacheSize


def import_bcrypt():
    try:
        import bcrypt
    except ImportError:
        raise UnsupportedError(
            "--web.config.file needs bcrypt for basic_auth_users",
            "pip install bcrypt (Debian: python3-bcrypt)",
        ) from None
    return bcrypt


class AuthCache:
    """web/cache.go: the outcome of a bcrypt check by (user, hash, password), failed ones too,
    bounded; when full, about a tenth of it is dropped at random. The key is a SHA-256 of the
    three, so a long password does not make a large entry and a changed hash is a miss.

    Unlike web/cache.go, successes and failures are kept apart, each bounded by `size`: in one
    cache, a flood of wrong passwords (each a new entry) drops a tenth of it at random every
    `size / 10` guesses, the scraper's entry with it within seconds, and its next scrape would
    then queue for bcrypt behind the flood. A success is only made by someone who knows a
    password, so failures can never push one out."""

    def __init__(self, size: int = _CACHE_SIZE):
        self.size = size
        self._good: dict[bytes, bool] = {}
        self._bad: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(user: bytes, hashed: str, password: bytes) -> bytes:
        # hex keeps the three apart, as in web/handler.go
        return hashlib.sha256(
            b":".join(
                (user.hex().encode(), hashed.encode().hex().encode(), password.hex().encode())
            )
        ).digest()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            if key in self._good:
                return True
            return self._bad.get(key)

    def set(self, key: bytes, ok: bool) -> None:
        with self._lock:
            entries = self._good if ok else self._bad
            if key not in entries and len(entries) >= self.size:
                for old in random.sample(list(entries), max(len(entries) // 10, 1)):
                    del entries[old]
            entries[key] = ok

    def __len__(self) -> int:
        with self._lock:
            return len(self._good) + len(self._bad)


def basic_credentials(authorization: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of `Basic base64(user:password)`, as Go's Request.BasicAuth() takes it;
    None when the header is absent or malformed."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(authorization[6:].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user, password


def checkpw(password: bytes, hashed: str) -> bool:
    bcrypt = import_bcrypt()
    try:
        return bcrypt.checkpw(password, hashed.encode("ascii"))
    except ValueError:  # bcrypt 5 refuses a password of more than 72 bytes
        return False


class BasicAuth:
    """basic_auth_users' checks, for the configuration that has them (its `users`, name to
    bcrypt hash; `_cache`, an AuthCache kept across reloads; `_dummy_hash`; `_bcrypt_lock`)."""

    users: dict[str, str]
    _cache: AuthCache
    _dummy_hash: str
    _bcrypt_lock: threading.Lock

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request's Authorization header names a user of basic_auth_users with its
        password; True when there are none (web/handler.go ServeHTTP). May run bcrypt, one
        check at a time: a server calls cached() first, and this only off its event loop."""
        ok = self.cached(authorization)
        if ok is not None:
            return ok
        user_bytes, password, hashed, is_user = self._lookup(authorization)  # cached() did
        key = AuthCache.key(user_bytes, hashed, password)
        with self._bcrypt_lock:
            ok = self._cache.get(key)  # another thread may have just checked the same
            if ok is None:
                # an unknown user costs one bcrypt, at the dummy hash's cost
                ok = checkpw(password, hashed) and is_user
                self._cache.set(key, ok)
        return ok and is_user

    def cached(self, authorization: str | None) -> bool | None:
        """What authorized() answers when that needs no bcrypt (no users, a malformed header,
        a check made before), without waiting for any lock but the cache's own; None when it
        needs a bcrypt check. What lets a known scraper through while a flood of wrong
        passwords waits for bcrypt (web/handler.go looks at its cache before bcryptMtx too)."""
        if not self.users:
            return True
        found = self._lookup(authorization)
        if found is None:
            return False
        user_bytes, password, hashed, is_user = found
        ok = self._cache.get(AuthCache.key(user_bytes, hashed, password))
        return None if ok is None else ok and is_user

    def _lookup(self, authorization: str | None) -> tuple[bytes, bytes, str, bool] | None:
        """(user, password, the hash to check it against, whether the user exists), or None
        for a header that is not Basic credentials. An unknown user gets the dummy hash."""
        credentials = basic_credentials(authorization)
        if credentials is None:
            return None
        user_bytes, password = credentials
        try:
            user = user_bytes.decode("utf-8")
        except UnicodeDecodeError:
            user = None
        hashed = self.users.get(user) if user is not None else None
        if hashed is None:
            return user_bytes, password, self._dummy_hash, False
        return user_bytes, password, hashed, True
