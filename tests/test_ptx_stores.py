"""A kernel that can never write its output is caught from its PTX, without a GPU: which
instructions may write global memory, and which functions a kernel reaches."""

from __future__ import annotations

import pytest

from cudalab.exercises.ptx_stores import function_bodies, global_stores, writes_global

PTX = """
.version 9.0
.target sm_90
.address_size 64

.func _Z3putPff(
	.param .b64 _Z3putPff_param_0,
	.param .b32 _Z3putPff_param_1
)
;
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);

.visible .entry empty(
	.param .u64 empty_param_0
)
.maxntid 256, 1, 1
{
	ret;
}

.visible .entry shared_only(
	.param .u64 shared_only_param_0
)
{
	.reg .b32 %r<3>;
	.shared .align 4 .b8 s[128];
	st.shared.u32 	[%r1], %r2;
	// st.global.f32 [%rd1], %f1; (a comment is no store)
	{ // a scoped block
	.reg .b32 temp;
	st.local.u32 [%rd1], %r2;
	}
	ret;
}

.visible .entry via_call(
	.param .u64 via_call_param_0
)
{
	{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd3;
	call.uni
	_Z3putPff,
	(
	param0
	);
	} // callseq 0
	ret;
}

.visible .entry predicated(
	.param .u64 predicated_param_0
)
{
	@%p1 bra 	$L__BB0_2;
	@!%p1 st.global.v4.f32 	[%rd4], {%f1, %f2, %f3, %f4};
$L__BB0_2:
	ret;
}

.func _Z3putPff(
	.param .b64 _Z3putPff_param_0,
	.param .b32 _Z3putPff_param_1
)
{
	st.u32 	[%rd2], %r1;
	ret;
}
"""


def test_only_defined_functions_have_bodies():
    assert set(function_bodies(PTX)) == {"empty", "shared_only", "via_call", "predicated",
                                         "_Z3putPff"}


@pytest.mark.parametrize("kernel, stores", [
    ("empty", 0), ("shared_only", 0),  # shared, local, comments: nothing reaches the output
    ("via_call", 1),  # the generic st of a device function it calls
    ("predicated", 1), ("missing", None)])
def test_global_stores_of_a_kernel(kernel, stores):
    assert global_stores(PTX, kernel) == stores


@pytest.mark.parametrize("opcode, writes", [
    ("st.global.f32", True), ("st.f32", True), ("st.volatile.u32", True),
    ("st.relaxed.gpu.global.u32", True), ("red.global.add.f32", True), ("atom.add.f32", True),
    ("atom.global.cas.b32", True), ("red.release.gpu.global.add.u32", True),
    ("wmma.store.d.sync.aligned.row.m16n16k16.global.f32", True),
    ("wmma.store.d.sync.aligned.row.m16n16k16.f32", True),
    ("cp.async.bulk.global.shared::cta.bulk_group", True),
    ("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", True),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", True),
    ("st.shared.f32", False), ("st.shared::cluster.u32", False), ("st.local.u32", False),
    ("st.param.b64", False), ("atom.shared.add.u32", False), ("red.shared.add.u32", False),
    ("cp.async.ca.shared.global", False), ("ld.global.f32", False), ("stmatrix.sync", False),
    ("mov.u32", False)])
def test_which_opcodes_may_write_global_memory(opcode, writes):
    assert writes_global(opcode) is writes
