from tests.support.node_cluster import node_cluster

__all__ = ["node_cluster"]
