"""NUMA topology from fake sysfs trees, and the CPU binding plan of worker ranks."""

from __future__ import annotations

import os

import pytest
from fake_hw import make_numa_tree, write

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.parallel.binding import binding_plan, describe_plan
from hwplug.platforms.numa import parse_cpulist, read_topology


def test_a_two_socket_host_reads_as_two_nodes(tmp_path):
    make_numa_tree(tmp_path, ["0-3,8-11", "4-7,12-15"], memory_kb=1024)
    nodes = read_topology(tmp_path)
    assert [(n.index, n.cpus, n.memory) for n in nodes] == [
        (0, (0, 1, 2, 3, 8, 9, 10, 11), 1024 * 1024), (1, (4, 5, 6, 7, 12, 13, 14, 15), 1048576)]


def test_no_topology_is_one_node_of_the_allowed_cpus(tmp_path):
    (node,) = read_topology(tmp_path)
    assert node.cpus == tuple(sorted(os.sched_getaffinity(0))) and node.memory is None


def test_an_arm_host_without_memory_info_and_with_an_empty_node(tmp_path):
    write(tmp_path, "sys/devices/system/node/node0/cpulist", "0-71\n")
    write(tmp_path, "sys/devices/system/node/node1/cpulist", "\n")  # memory-only (HBM) node
    (node,) = read_topology(tmp_path)
    assert (node.index, len(node.cpus), node.memory) == (0, 72, None)


@pytest.mark.parametrize("world_size, expected", [
    (2, ["rank 0: cpus 0-3", "rank 1: cpus 4-7"]),
    (4, ["rank 0: cpus 0-1", "rank 1: cpus 2-3", "rank 2: cpus 4-5", "rank 3: cpus 6-7"]),
    (1, ["rank 0: cpus 0-3"]),
])
def test_auto_binds_ranks_to_nodes_and_shares_a_node_evenly(tmp_path, world_size, expected):
    make_numa_tree(tmp_path, ["0-3", "4-7"])
    assert describe_plan(binding_plan("auto", read_topology(tmp_path), world_size)) == expected


def test_explicit_lists_and_none(tmp_path):
    nodes = read_topology(tmp_path)
    assert binding_plan("0-1,4|2-3", nodes, 2) == [(0, 1, 4), (2, 3)]
    assert describe_plan(binding_plan("none", nodes, 2)) == ["no binding"]
    with pytest.raises(ConfigError, match="lists 1 CPU sets; give one non-empty set per rank "
                                          r"\(2\)"):
        binding_plan("0-3", nodes, 2)
    with pytest.raises(ValueError, match="'3-1' in '3-1' is not a CPU range"):
        parse_cpulist("3-1")
    with pytest.raises(ConfigError, match="HWPLUG_CPU_BIND='0-3|x': 'x' is not a CPU list"):
        binding_plan("0-3|x", nodes, 2)
