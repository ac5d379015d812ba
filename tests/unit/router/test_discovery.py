"""Static endpoints and EndpointSlice parsing (no API server needed; credentials: tests/unit/kube/test_credentials.py)."""

from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.config import RouterConfig
from epd_operator.router.discovery import slice_endpoints, split_urls, static_endpoints
from epd_operator.router.metrics import RouterMetrics


def test_static_urls_are_normalised_and_mooncake_addresses_follow_the_consumer_tier():
    assert split_urls(" localhost:8001, http://e2:8000/ ,") == ["http://localhost:8001", "http://e2:8000"]
    cfg = RouterConfig(
        encode_urls=["http://e:1"],
        prefill_urls=["http://p:1", "http://p:2"],
        decode_urls=["http://d:1"],
        ec_consumer_zmq_addrs=["tcp://p1:14579", "tcp://p2:14579"],
    )
    eps = static_endpoints(cfg)
    assert [e.ec_zmq for e in eps["prefill"]] == ["tcp://p1:14579", "tcp://p2:14579"]
    assert [e.ec_zmq for e in eps["decode"]] == [None]


def test_slice_endpoints_read_the_named_port_readiness_and_pod():
    eps = {
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": ["fd00::5"], "conditions": {"ready": True}, "targetRef": {"kind": "Pod", "name": "enc-0"}},
            {
                "addresses": ["10.0.0.6"],
                "conditions": {"ready": False, "terminating": True},
                "targetRef": {"kind": "Pod", "name": "enc-1"},
            },
            {"addresses": ["10.0.0.7"]},
            {"addresses": []},
        ],
    }
    got = [(e.url, e.ready, e.pod, e.ec_zmq) for e in slice_endpoints(eps, "http", 9000, 14579)]
    assert got == [
        ("http://[fd00::5]:8000", True, "enc-0", "tcp://[fd00::5]:14579"),
        ("http://10.0.0.6:8000", False, "enc-1", "tcp://10.0.0.6:14579"),
        ("http://10.0.0.7:8000", True, "", "tcp://10.0.0.7:14579"),
    ]
    assert (
        slice_endpoints({"endpoints": [{"addresses": ["10.0.0.1"]}]}, "http", 9000, None)[0].url
        == "http://10.0.0.1:9000"
    )


def test_no_urls_and_a_bare_host_name():
    assert split_urls(None) == [] and split_urls("") == []
    assert split_urls("BOX/") == ["http://BOX"]  # only slashes are trimmed: a host may end in any letter


def test_the_backend_port_is_the_named_one_else_a_single_declared_one_else_the_default():
    def port(*ports: dict) -> str:
        (found,) = slice_endpoints(
            {"ports": list(ports), "endpoints": [{"addresses": ["10.0.0.1"]}]}, "api", 9000, None
        )
        return found.url

    assert port({"name": "metrics", "port": 9090}, {"name": "api", "port": 8100}) == "http://10.0.0.1:8100"
    assert port({"name": "api"}, {"name": "metrics", "port": 9090}) == "http://10.0.0.1:9000"  # named, no number
    assert port({"name": "other", "port": 8200}) == "http://10.0.0.1:8200"  # the only port, whatever its name
    assert port({"name": "other"}) == "http://10.0.0.1:9000"
    assert port({"name": "a", "port": 8300}, {"name": "b", "port": 8400}) == "http://10.0.0.1:9000"


def test_slice_endpoints_skip_addressless_ones_and_name_only_pods():
    eps = {
        "ports": [{"name": "http", "port": 8000}, {"name": "ec-dp0", "port": 20003}, {"name": "ec-dpx", "port": 1}],
        "endpoints": [
            {"addresses": []},
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "VirtualMachineInstance", "name": "vm-1"}},
            {"addresses": ["10.0.0.2"], "targetRef": {"name": "enc-2"}},  # no kind: a Pod
        ],
    }
    got = [(e.url, e.pod, e.ec_zmq, e.ec_zmq_ranks) for e in slice_endpoints(eps, "http", 9000, 14579)]
    assert got == [
        ("http://10.0.0.1:8000", "", "tcp://10.0.0.1:20003", ("tcp://10.0.0.1:20003",)),  # `ec-dpx`: not a rank
        ("http://10.0.0.2:8000", "enc-2", "tcp://10.0.0.2:20003", ("tcp://10.0.0.2:20003",)),
    ]
    # Not the Mooncake consumer tier: no control addresses, whatever ports the Service declares.
    assert [(e.ec_zmq, e.ec_zmq_ranks) for e in slice_endpoints(eps, "http", 9000, None)] == [(None, ())] * 2


def test_a_rediscovered_backend_keeps_its_health_load_and_mooncake_address():
    pool = Pool("decode", RouterMetrics(), eject_after=1)
    found = [
        DiscoveredEndpoint("http://10.0.0.1:8000", pod="pd-0", ec_zmq="tcp://10.0.0.1:14579"),
        DiscoveredEndpoint("https://10.0.0.2:8443", pod="pd-1", ec_zmq="tcp://10.0.0.2:14579"),
    ]
    pool.update(found)
    plain, tls = pool.endpoints.values()
    pool.acquire(plain, 2)
    pool.record_failure(tls, "health")
    pool.update(found)  # the next list or watch event names the same backends
    assert [(d["url"], d["inflight"], d["healthy"]) for d in pool.describe()] == [
        ("http://10.0.0.1:8000", 2, True),
        ("https://10.0.0.2:8443", 0, False),
    ]
    assert pool.available == [plain]
    assert [repr(ep) for ep in pool.endpoints.values()] == [
        "Endpoint(decode http://10.0.0.1:8000 load=2 available=True)",
        "Endpoint(decode https://10.0.0.2:8443 load=0 available=False)",
    ]
    assert [(ep.origin, ep.ec_zmq) for ep in pool.endpoints.values()] == [
        ("http://10.0.0.1:8000", "tcp://10.0.0.1:14579"),
        ("https://10.0.0.2:8443", "tcp://10.0.0.2:14579"),  # dialled over TLS, as discovered
    ]


def test_an_address_in_several_slices_is_one_endpoint_ready_if_any_slice_says_so():
    pool = Pool("encoder", RouterMetrics())
    pool.update(
        [
            DiscoveredEndpoint("http://10.0.0.1:8000", ready=False, pod="old"),
            DiscoveredEndpoint("http://10.0.0.1:8000", ready=False, pod="new"),
            DiscoveredEndpoint("http://10.0.0.2:8000", ready=False),
            DiscoveredEndpoint("http://10.0.0.2:8000", ready=True),
        ]
    )
    assert [(d["url"], d["pod"], d["ready"]) for d in pool.describe()] == [
        ("http://10.0.0.1:8000", "new", False),
        ("http://10.0.0.2:8000", "", True),
    ]
    assert [ep.url for ep in pool.available] == ["http://10.0.0.2:8000"]
