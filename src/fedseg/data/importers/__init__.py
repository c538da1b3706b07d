"""Importers turning common public layouts into federation folders (docs/data.md)."""

from fedseg.data.importers.folder import import_folder
from fedseg.data.importers.h5 import H5_WEAK_KEYS, import_h5
from fedseg.data.importers.nifti import NiftiImport, import_nifti

__all__ = ["H5_WEAK_KEYS", "NiftiImport", "import_folder", "import_h5", "import_nifti"]
