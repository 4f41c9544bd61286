"""Uploads' flow control: each upload's window is its link's bandwidth-delay product capped by
the receive budget's share, and a worker never has more than its window (plus one chunk) ahead
of what the aggregator consumed, over a real gRPC stream."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from powertrip.services.aggregator.upload_flow import MIN_WINDOW, MiB, ReceiveBudget, credited
from powertrip.services.common.chunk_wire import chunk_request, read_submit_request
from powertrip.services.worker.upload_credit import Credit, metered, upload
from powertrip.v1 import aggregator_pb2

METHOD = "/test.Flow/Upload"
CHUNK = 256 << 10


def test_a_lone_upload_gets_the_whole_budget_and_shares_shrink_as_uploads_start():
    budget = ReceiveBudget(64 * MiB, 256 * MiB)
    budget.open()
    assert budget.window(0) == 64 * MiB
    for _ in range(7):
        budget.open()
    assert budget.window(0) == 8 * MiB
    for _ in range(7):
        budget.close()
    assert budget.window(0) == 64 * MiB


def test_a_measured_link_asks_for_twice_its_bandwidth_delay_product_within_the_limits():
    links = {1: (0.050, 20 * MiB), 2: (0.200, 1000 * MiB), 3: (0.0001, 1 * MiB)}
    budget = ReceiveBudget(64 * MiB, 32 * MiB, links.get)
    budget.open()
    assert budget.window(1) == 2 * MiB  # 2 x 50 ms x 20 MiB/s
    assert budget.window(2) == 32 * MiB  # the transport window caps a fat long link
    assert budget.window(3) == MIN_WINDOW  # never below two chunks
    assert budget.window(4) == 32 * MiB  # unmeasured: what the budget and window allow
    for _ in range(63):
        budget.open()
    assert budget.window(2) == MIN_WINDOW  # 64 uploads share 64 MiB


def test_uploads_starting_one_after_another_never_hold_more_credit_than_the_budget():
    budget = ReceiveBudget(32 * MiB, 64 * MiB)
    held = []
    for _ in range(8):  # each starts while the earlier ones still hold their credit
        budget.open()
        held.append(budget.grant(None, 0))
    assert held[0] == 32 * MiB  # alone: the whole budget
    assert held[1:] == [MIN_WINDOW] * 7  # the rest start on the floor, not a fresh share each
    assert budget.outstanding == sum(held) <= 32 * MiB + 8 * MIN_WINDOW
    budget.consumed(24 * MiB)  # the first consumes; a later one may grow into what it freed
    assert budget.grant(None, MIN_WINDOW) == 4 * MiB - MIN_WINDOW  # its 4 MiB share of 32
    assert budget.outstanding <= 32 * MiB


def test_a_grant_is_batched_to_a_quarter_window_but_never_leaves_an_upload_below_the_floor():
    budget = ReceiveBudget(64 * MiB, 64 * MiB)
    budget.open()
    assert budget.grant(None, 60 * MiB) == 0  # 4 MiB due: less than a quarter of 64
    assert budget.grant(None, 40 * MiB) == 24 * MiB
    budget.outstanding = 64 * MiB  # others hold the whole budget
    assert budget.grant(None, 0) == MIN_WINDOW


def test_chunks_wait_for_credit_and_other_parts_do_not():
    credit = Credit()
    parts = [b"\x0aheader", chunk_request(0, [memoryview(b"x" * 10)]), b"\x22trailer"]
    out = metered(iter(parts), credit)
    assert next(out) == parts[0]
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.extend(out))
    waiter.start()
    time.sleep(0.2)
    assert got == []  # the chunk waits: no credit yet
    credit.grant(1)
    waiter.join(10)
    assert got == parts[1:]


def test_an_ended_call_releases_a_sender_waiting_for_credit():
    credit = Credit()
    out = metered(iter([chunk_request(0, [memoryview(b"x")])]), credit)
    waiter = threading.Thread(target=lambda: list(out))
    waiter.start()
    credit.end()
    waiter.join(10)
    assert not waiter.is_alive()


@pytest.fixture
def slow_sink():
    """A server whose upload body consumes chunks slowly, recording how much it consumed."""
    consumed: list[int] = [0]
    budget = ReceiveBudget(2 * MiB, 64 * MiB)

    def body(requests, context):
        for msg in requests:
            if msg.WhichOneof("part") == "chunk":
                time.sleep(0.002)
                consumed[0] += len(msg.chunk.data)
        return aggregator_pb2.SubmitUpdateResponse(accepted=True)

    handler = grpc.method_handlers_generic_handler(
        "test.Flow",
        {
            "Upload": grpc.stream_stream_rpc_method_handler(
                lambda requests, context: credited(body, requests, context, budget),
                request_deserializer=read_submit_request,
                response_serializer=aggregator_pb2.UploadReply.SerializeToString,
            )
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(4),
        handlers=[handler],
        options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 64 * MiB)],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, consumed, budget
    server.stop(None)


def test_the_sender_stays_within_its_window_of_what_the_receiver_consumed(slow_sink):
    port, consumed, budget = slow_sink
    sent = [0]
    ahead: list[int] = []
    header = aggregator_pb2.SubmitUpdateRequest(
        update=aggregator_pb2.UpdateHeader(site_id="site-0")
    ).SerializeToString()

    def wire():
        yield header
        for i in range(64):  # 16 MiB in 256 KiB chunks
            ahead.append(sent[0] - consumed[0])
            sent[0] += CHUNK
            yield chunk_request(i * CHUNK, [memoryview(bytes(CHUNK))])

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=None,
            response_deserializer=aggregator_pb2.UploadReply.FromString,
        )
        result = upload(call, wire(), timeout_s=60)
    assert result.accepted
    assert consumed[0] == 64 * CHUNK
    window = budget.window(0)
    assert window == 2 * MiB
    # what the sender had sent beyond the receiver's consumption when it sent each chunk
    assert max(ahead) <= window + CHUNK
    assert budget.in_flight == 0  # the upload gave its share back
