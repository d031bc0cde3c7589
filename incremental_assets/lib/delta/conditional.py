"""The object store's one promise that one writer per table rests on: a PUT with `If-None-Match: *`
fails when the object exists. deltalake commits every `_delta_log/N.json` that way, so of two
writers taking the run log's lease at once one fails; a store that ignored the header would let
both commits land, the second over the first. Checked once per process and warehouse, before a
run's first write, with two such PUTs of a probe object; a store that fails it is refused."""

from __future__ import annotations

import uuid
from functools import cache

from incremental_assets.lib.environment import is_object_store, s3_endpoint


class ConditionalWritesUnsupported(RuntimeError):
    """The warehouse's object store overwrote an object a conditional PUT should have kept."""


def ensure_conditional_writes(root: str) -> None:
    """Refuse a warehouse on an object store that does not honour conditional writes (no-op on disk)."""
    if is_object_store(root):
        _check(root.rstrip("/"))


@cache
def _check(root: str) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    endpoint = s3_endpoint()
    client = boto3.client("s3", endpoint_url=endpoint.url, region_name=endpoint.region,
                          config=Config(s3={"addressing_style": "virtual" if endpoint.virtual_hosted else "path"}))
    bucket, _, prefix = root.split("://", 1)[1].partition("/")
    key = f"{prefix}/_probe/conditional-write-{uuid.uuid4().hex}".lstrip("/")
    client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    except ClientError as error:
        if error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            return  # refused, as it must be
        raise
    finally:
        client.delete_object(Bucket=bucket, Key=key)
    raise ConditionalWritesUnsupported(
        f"The object store of {root} overwrote an object that a conditional write (If-None-Match: *) should have "
        "kept: two runs could then both take the run log's lease and write the same tables. Use a store that "
        "supports conditional writes (Amazon S3 does; check your S3-compatible server's documentation)."
    )
