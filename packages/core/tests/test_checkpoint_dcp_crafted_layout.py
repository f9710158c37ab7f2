"""DCP metadata whose declarations do not match the checkpoint's files is refused, naming the file and the
fault, before torch allocates or reads anything by it: sizes beyond the bytes on disk, chunks that leave
part of a tensor unsaved or reuse another's bytes, deep or malformed ``planner_data``; a piece whose bytes
are not a tensor is called corrupt, never met with advice to switch the weights-only check off."""

import pickle

import pytest
import torch

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, dcp_layout, read_full_checkpoint
from stratagem.checkpoint_io.dcp_metadata import read_metadata
from stratagem.checkpoint_io.sharded import METADATA_FILE, DistributedCheckpointIO
from stratagem.cli.main import main

WEIGHT = "module.weight"


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A small DCP checkpoint: an [8, 32] weight, an optimizer state and loop counters."""
    directory = tmp_path_factory.mktemp("genuine") / "checkpoint"
    weight = torch.arange(256, dtype=torch.float32).reshape(8, 32)
    optimizer = {"state": {0: {"momentum_buffer": torch.ones(8, 32)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    checkpoint = {"module": {"weight": weight}, "optimizers": [optimizer], "loops": {"fit": {"global_step": 3}}}
    DistributedCheckpointIO().save_checkpoint(checkpoint, directory)
    return directory


def _copy(genuine, tmp_path):
    directory = tmp_path / "crafted"
    directory.mkdir()
    for file in genuine.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    return directory


def _rewritten(genuine, tmp_path, change):
    """A copy of ``genuine`` whose metadata ``change`` edited."""
    directory = _copy(genuine, tmp_path)
    metadata = read_metadata(directory / METADATA_FILE)
    change(metadata)
    (directory / METADATA_FILE).write_bytes(pickle.dumps(metadata, protocol=2))
    return directory


def _resize(metadata, size, chunks):
    entry = metadata.state_dict_metadata[WEIGHT]
    entry.size = torch.Size(size)
    [chunk] = entry.chunks
    [index] = [index for index in metadata.storage_data if index.fqn == WEIGHT]
    info = metadata.storage_data.pop(index)
    entry.chunks = []
    for offsets, sizes in chunks:
        entry.chunks.append(type(chunk)(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
        metadata.storage_data[type(index)(WEIGHT, offsets)] = info


def _read(directory):
    return dict(read_full_checkpoint(directory, TorchCheckpointIO()))


@pytest.fixture(params=["in Python", "in a tensor"])
def counting(request, monkeypatch):
    """Both ways the coverage check counts the chunks holding each cell."""
    if request.param == "in a tensor":
        monkeypatch.setattr(dcp_layout, "_SMALL_GRID_CELLS", 0)
    return request.param


def test_genuine_metadata_passes_every_check_and_loads_the_saved_values(genuine, counting):
    loaded = _read(genuine)
    assert torch.equal(loaded["module"]["weight"], torch.arange(256, dtype=torch.float32).reshape(8, 32))
    assert loaded["loops"] == {"fit": {"global_step": 3}}


def test_a_terabyte_tensor_declared_over_a_few_kilobytes_is_refused_before_any_allocation(genuine, tmp_path):
    terabyte = 1 << 38  # float32 elements
    directory = _rewritten(genuine, tmp_path, lambda m: _resize(m, [terabyte], [([0], [terabyte])]))
    with pytest.raises(CheckpointError, match=rf"crafted/\.metadata'.*'module\.weight'.*{terabyte * 4} bytes.*stores"):
        _read(directory)


@pytest.mark.parametrize("load", ["read whole", "into a module", "consolidate"])
def test_chunks_that_leave_part_of_a_tensor_unsaved_are_refused(genuine, tmp_path, capsys, load, counting):
    # Twice the saved rows, the saved chunk covering only the first half: torch would load the rest uninitialised.
    directory = _rewritten(genuine, tmp_path, lambda m: _resize(m, [16, 32], [([0, 0], [8, 32])]))
    message = r"crafted/\.metadata'.*chunks of 'module\.weight' do not cover its size \[16, 32\]"
    if load == "consolidate":
        assert main(["consolidate", str(directory), str(tmp_path / "out.pt")]) == 2
        assert "do not cover" in capsys.readouterr().err
        assert not (tmp_path / "out.pt").exists()
    elif load == "into a module":
        with pytest.raises(CheckpointError, match=message):
            DistributedCheckpointIO().load_into(directory, {"module": {"weight": torch.zeros(16, 32)}})
    else:
        with pytest.raises(CheckpointError, match=message):
            _read(directory)


def test_a_large_tensor_built_from_one_piece_read_many_times_is_refused(genuine, tmp_path, capsys):
    # 64 chunks that cover a [512, 32] tensor, all pointing at the one saved piece: more bytes than the files hold.
    chunks = [([8 * row, 0], [8, 32]) for row in range(64)]
    directory = _rewritten(genuine, tmp_path, lambda m: _resize(m, [512, 32], chunks))
    assert main(["consolidate", str(directory), str(tmp_path / "out.pt")]) == 2
    assert "overlapping bytes of '__0_0.distcp'" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()


def test_chunks_sharing_bytes_are_refused(genuine, tmp_path):
    directory = _rewritten(genuine, tmp_path, lambda m: _resize(m, [8, 32], [([0, 0], [8, 32]), ([4, 0], [4, 32])]))
    with pytest.raises(CheckpointError, match=r"stores 'module\.weight' and 'module\.weight' in overlapping bytes"):
        _read(directory)


def test_overlapping_chunks_are_refused(genuine, tmp_path, counting):
    def overlap(metadata):
        # The second chunk's bytes are those of the momentum buffer, which the metadata then no longer lists.
        [momentum] = [name for name in metadata.state_dict_metadata if name.endswith("momentum_buffer")]
        del metadata.state_dict_metadata[momentum], metadata.planner_data[momentum]
        [index] = [index for index in metadata.storage_data if index.fqn == momentum]
        elsewhere = metadata.storage_data.pop(index)
        _resize(metadata, [8, 32], [([0, 0], [8, 32]), ([4, 0], [4, 32])])
        metadata.storage_data[type(index)(WEIGHT, [4, 0])] = elsewhere

    with pytest.raises(CheckpointError, match=r"crafted/\.metadata'.*chunks of 'module\.weight' overlap"):
        _read(_rewritten(genuine, tmp_path, overlap))


def test_a_piece_past_the_end_of_its_file_is_called_truncated(genuine, tmp_path):
    directory = _copy(genuine, tmp_path)
    [piece] = directory.glob("*.distcp")
    piece.write_bytes(piece.read_bytes()[:-100])
    message = r"crafted/\.metadata'.*of '__0_0\.distcp', which has \d+ bytes.*truncated"
    with pytest.raises(CheckpointError, match=message):
        _read(directory)


_LOADS = {
    "read whole": _read,
    "into a module": lambda directory: DistributedCheckpointIO().load_into(
        directory, {"module": {"weight": torch.zeros(8, 32)}}
    ),
}


@pytest.mark.parametrize("load", sorted(_LOADS))
def test_a_directory_without_its_plain_state_is_refused_naming_the_missing_file(genuine, tmp_path, load):
    directory = _copy(genuine, tmp_path)
    (directory / "plain_state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"crafted' is incomplete: it lacks plain_state\.pt, which holds"):
        _LOADS[load](directory)


def _nested_list_pickle(metadata, depth):
    """``metadata`` pickled with one planner_data path replaced by a list nested ``depth`` deep (built by
    opcodes: pickling such a list would itself exceed the recursion limit)."""
    marker = "NESTED-LIST-HERE"
    metadata.planner_data[WEIGHT] = marker
    data = pickle.dumps(metadata, protocol=2)
    encoded = marker.encode()
    opcode = b"X" + len(encoded).to_bytes(4, "little") + encoded
    assert data.count(opcode) == 1
    return data.replace(opcode, b"]" * depth + b"a" * (depth - 1))


@pytest.mark.parametrize(
    ("planner_data", "message"),
    [
        ("a path 200,000 long", "planner_data path for 'module.weight' nests 200000 deep"),
        ("a list nested 200,000 deep", "planner_data path for 'module.weight' starts with a list, not a name"),
        ("an int for a path", "planner_data maps 'module.weight' to 7, not to a path"),
        ("an int for the mapping", "planner_data is an int, not a dict"),
        ("a list index of 10**12", "holds 1000000000000, not a name or a list index"),
        ("a value that is also a container", "path \\['module'\\] both for a value and for a container"),
    ],
)
def test_malformed_planner_data_is_refused_naming_the_entry(genuine, tmp_path, planner_data, message):
    directory = _copy(genuine, tmp_path)
    metadata = read_metadata(directory / METADATA_FILE)
    paths = metadata.planner_data
    if planner_data == "a list nested 200,000 deep":
        data = _nested_list_pickle(metadata, 200_000)
    else:
        if planner_data == "a path 200,000 long":
            paths[WEIGHT] = ("module",) + ("weight",) * 199_999
        elif planner_data == "an int for a path":
            paths[WEIGHT] = 7
        elif planner_data == "an int for the mapping":
            metadata.planner_data = 7
        elif planner_data == "a list index of 10**12":
            paths[WEIGHT] = ("module", 10**12)
        else:
            paths["extra"] = ("module",)
        data = pickle.dumps(metadata, protocol=2)
    (directory / METADATA_FILE).write_bytes(data)
    with pytest.raises(CheckpointError, match=rf"crafted/\.metadata'.*{message}"):
        _read(directory)


def test_a_fault_names_a_huge_or_escaping_entry_name_shortened_and_escaped(genuine, tmp_path):
    name = "\x1b[2J" + "w" * 1_000_000

    def rename(metadata):
        _resize(metadata, [16, 32], [([0, 0], [8, 32])])
        metadata.state_dict_metadata[name] = metadata.state_dict_metadata.pop(WEIGHT)
        for index in [index for index in metadata.storage_data if index.fqn == WEIGHT]:
            metadata.storage_data[type(index)(name, index.offset)] = metadata.storage_data.pop(index)

    with pytest.raises(CheckpointError, match="do not cover") as raised:
        _read(_rewritten(genuine, tmp_path, rename))
    assert "\x1b" not in str(raised.value)
    assert len(str(raised.value)) < 1000


def test_metadata_with_attributes_torch_never_writes_is_refused(genuine, tmp_path):
    directory = _rewritten(genuine, tmp_path, lambda m: setattr(m.state_dict_metadata[WEIGHT], "extra", [1]))
    with pytest.raises(CheckpointError, match=r"'module\.weight' carries attributes a TensorStorageMetadata does not"):
        _read(directory)


def test_compressed_pieces_are_refused_since_their_size_cannot_be_checked(genuine, tmp_path):
    def compress(metadata):
        for info in metadata.storage_data.values():
            info.transform_descriptors = ["stream.zstd"]

    with pytest.raises(CheckpointError, match=r"is transformed \(a list, e\.g\. compressed\)"):
        _read(_rewritten(genuine, tmp_path, compress))


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_zeroed_piece_is_called_corrupt_without_weights_only_advice(genuine, tmp_path, weights_only):
    directory = _copy(genuine, tmp_path)
    [piece] = directory.glob("*.distcp")
    piece.write_bytes(bytes(piece.stat().st_size))
    with pytest.raises(CheckpointError) as raised:
        dict(read_full_checkpoint(directory, TorchCheckpointIO(), weights_only=weights_only))
    message = str(raised.value)
    assert "__0_0.distcp' (bytes" in message, message
    assert "truncated or corrupt" in message, message
    assert "weights_only=False" not in message, message
