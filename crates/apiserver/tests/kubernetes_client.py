"""The official Python `kubernetes` client against the lab API server.

Run by tests/python_client.rs with the kubeconfig path as its argument, after the Rust side has
created the Service `proto` with a protobuf body (as Go clients and kubectl's generators send).
Checks what makes the lab look like a cluster: Events from one store seen through both groups,
Table responses, protobuf-created objects reading back as JSON, and 406 for protobuf-only Accept.
"""

import datetime
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def table(api, path):
    return api.api_client.call_api(
        path, "GET", header_params={"Accept": TABLE}, response_type="object",
        _return_http_data_only=True)


def main(kubeconfig):
    config.load_kube_config(config_file=kubeconfig)
    core = client.CoreV1Api()
    events = client.EventsV1Api()
    now = datetime.datetime.now(datetime.timezone.utc)

    svc = core.create_namespaced_service("default", client.V1Service(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1ServiceSpec(type="LoadBalancer", selector={"app": "web"},
                                  ports=[client.V1ServicePort(port=80, target_port=8080)])))
    core.patch_namespaced_service_status("web", "default", {
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}})

    # An events.k8s.io Event, as berth's controller writes it, read through core/v1 with the
    # field selector `kubectl describe` uses.
    events.create_namespaced_event("default", client.EventsV1Event(
        metadata=client.V1ObjectMeta(name="web.1"), event_time=now,
        reporting_controller="berth.dev/controller", reporting_instance="controller-0",
        action="Allocate", reason="IPAllocated", type="Normal", note="assigned 198.18.0.200",
        regarding=client.V1ObjectReference(api_version="v1", kind="Service", name="web",
                                           namespace="default", uid=svc.metadata.uid),
        series=client.EventsV1EventSeries(count=3, last_observed_time=now)))
    selector = ("involvedObject.name=web,involvedObject.namespace=default,"
                f"involvedObject.kind=Service,involvedObject.uid={svc.metadata.uid}")
    seen = core.list_namespaced_event("default", field_selector=selector).items
    assert [e.metadata.name for e in seen] == ["web.1"], seen
    e = seen[0]
    assert e.message == "assigned 198.18.0.200", e
    assert e.reporting_component == "berth.dev/controller", e
    assert e.reporting_instance == "controller-0", e
    assert e.involved_object.uid == svc.metadata.uid, e
    assert e.series.count == 3, e

    # A core/v1 Event read through events.k8s.io.
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="web.old"), event_time=now,
        involved_object=client.V1ObjectReference(kind="Service", name="web", namespace="default"),
        reason="Legacy", message="written through core", type="Warning", count=2,
        source=client.V1EventSource(component="old-controller", host="n1"),
        first_timestamp=now, last_timestamp=now))
    old = events.read_namespaced_event("web.old", "default")
    assert old.note == "written through core", old
    assert old.regarding.name == "web", old
    assert old.deprecated_count == 2, old
    assert old.deprecated_source.component == "old-controller", old
    names = sorted(x.metadata.name for x in events.list_namespaced_event("default").items)
    assert names == ["web.1", "web.old"], names

    # Tables: the server's columns and cells.
    services = table(core, "/api/v1/namespaces/default/services")
    columns = [c["name"] for c in services["columnDefinitions"]]
    assert columns == ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"], columns
    rows = {r["cells"][0]: r["cells"] for r in services["rows"]}
    assert rows["web"][1:5] == ["LoadBalancer", "<none>", "198.18.0.200", "80/TCP"], rows["web"]
    assert rows["web"][6] == "app=web", rows["web"]
    assert services["rows"][0]["object"]["kind"] == "PartialObjectMetadata", services["rows"][0]
    ev_table = table(core, "/apis/events.k8s.io/v1/namespaces/default/events/web.1")
    assert [c["name"] for c in ev_table["columnDefinitions"]][:4] == ["Last Seen", "Type", "Reason", "Object"]
    cells = ev_table["rows"][0]["cells"]
    assert cells[2:4] == ["IPAllocated", "service/web"], cells
    assert cells[5] == "berth.dev/controller, controller-0" and cells[8] == 3, cells

    # Created from a protobuf body, read as JSON by the typed client.
    proto = core.read_namespaced_service("proto", "default")
    assert proto.spec.type == "LoadBalancer", proto.spec
    assert proto.spec.ports[0].port == 80 and proto.spec.ports[0].target_port == 8080, proto.spec
    assert proto.spec.selector == {"app": "proto"}, proto.spec

    # Nothing the lab can answer: 406 in the apiserver's words.
    try:
        core.api_client.call_api("/api/v1/namespaces/default/services/web", "GET",
                                 header_params={"Accept": "application/vnd.kubernetes.protobuf"},
                                 response_type="object")
        raise AssertionError("protobuf-only Accept was answered")
    except ApiException as err:
        assert err.status == 406, err

    print("python-client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
