//! What kind installs besides the node: CoreDNS, local-path-provisioner as
//! the default StorageClass `standard`, and (as ctlptl does) the
//! `kube-public/local-registry-hosting` ConfigMap that tells Tilt where to
//! push.

/// CoreDNS with the `kubernetes` plugin only: no forwarder, so no name
/// lookup leaves the node.
pub const COREDNS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations: [{operator: Exists}]
      containers:
        - name: coredns
          image: petstore.local/coredns:COREDNS_VERSION
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
            periodSeconds: 2
          livenessProbe:
            httpGet: {path: /health, port: 8080}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
        - name: config
          configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: 10.96.0.10
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
"#;

/// rancher's local-path-provisioner, as kind ships it: hostPath directories
/// made 0777 by a helper pod, StorageClass `standard` marked default.
pub const LOCAL_PATH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: local-path-storage}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: local-path-provisioner-service-account, namespace: local-path-storage}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: local-path-provisioner-role}
rules:
  - apiGroups: [""]
    resources: [nodes, persistentvolumeclaims, configmaps, pods, pods/log]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [persistentvolumes, pods]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
  - apiGroups: [storage.k8s.io]
    resources: [storageclasses]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: local-path-provisioner-bind}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: local-path-provisioner-role}
subjects: [{kind: ServiceAccount, name: local-path-provisioner-service-account, namespace: local-path-storage}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-path-config, namespace: local-path-storage}
data:
  config.json: |-
    {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["LOCAL_PATH_DIR"]}]}
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata:
      name: helper-pod
    spec:
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      containers:
        - name: helper-pod
          image: petstore.local/busybox:static
          imagePullPolicy: Never
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: local-path-provisioner, namespace: local-path-storage}
spec:
  replicas: 1
  selector: {matchLabels: {app: local-path-provisioner}}
  template:
    metadata: {labels: {app: local-path-provisioner}}
    spec:
      serviceAccountName: local-path-provisioner-service-account
      tolerations: [{operator: Exists}]
      containers:
        - name: local-path-provisioner
          image: petstore.local/local-path-provisioner:LPP_VERSION
          imagePullPolicy: Never
          args: [start, --config, /etc/config/config.json]
          env:
            - name: POD_NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
            - {name: CONFIG_MOUNT_PATH, value: /etc/config/}
          volumeMounts: [{name: config, mountPath: /etc/config/}]
      volumes:
        - name: config
          configMap: {name: local-path-config}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
"#;

/// KEP-1755, as ctlptl writes it: Tilt reads it to push to the registry.
pub const REGISTRY_HOSTING: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: local-registry-hosting, namespace: kube-public}
data:
  localRegistryHosting.v1: |
    host: "localhost:5005"
    hostFromContainerRuntime: "localhost:5005"
    help: "https://kind.sigs.k8s.io/docs/user/local-registry/"
"#;
