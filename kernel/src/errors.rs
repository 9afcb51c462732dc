//! The kernel's exceptions, one root and a class per kind of failure, so
//! that the Python side catches what it can act on by type (see
//! `bitroute_kernel.pyi`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;

create_exception!(
    bitroute_kernel,
    KernelError,
    PyException,
    "Root of every exception the kernel raises."
);
create_exception!(
    bitroute_kernel,
    TableError,
    KernelError,
    "The tables or arrays handed to the kernel are inconsistent: a length, \
     a slot or exchange number out of range, a string column that is not \
     UTF-8, an unknown dialect. A caller's bug or a malformed snapshot, never \
     a bad publish."
);
create_exception!(
    bitroute_kernel,
    ColumnOverflowError,
    KernelError,
    "A batch's deliveries column would exceed Arrow's 32-bit offsets: the \
     batch must be matched in smaller parts."
);
