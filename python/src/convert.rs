//! Conversions between Rust values and Python objects: JSON values to dicts and lists, Python
//! dicts to serde types (through `json.dumps`), and read-only numpy views of memory that a
//! Python object keeps alive.

use crate::errors::{raise, Kind};
use numpy::ndarray::{ArrayView, Dimension};
use numpy::{Element, PyArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A JSON value as the Python object `json.loads` would give (dict, list, str, int, float,
/// bool, None).
pub fn json_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Any serialisable Rust value as a Python object (through its JSON form).
pub fn to_py<'py, T: serde::Serialize>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(v).map_err(|e| raise(Kind::Base, e.to_string()))?;
    json_to_py(py, &value)
}

/// A Python object (a dict of settings) as a serde value: the object goes through
/// `json.dumps`, and serde's message (unknown field, wrong type) becomes an
/// `InvalidArgumentError` prefixed with `what`.
pub fn from_py<T: DeserializeOwned>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    let py = obj.py();
    let text: String = py
        .import("json")?
        .call_method1("dumps", (obj,))
        .map_err(|e| raise(Kind::Invalid, format!("{what}: {}", e.value(py))))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| raise(Kind::Invalid, format!("{what}: {e}")))
}

/// A read-only numpy array over `data` (shape `dim`, C order) whose base object is `owner`.
///
/// # Safety
/// `data` must stay valid and unchanged for as long as `owner` is alive (it is memory that
/// `owner` holds, e.g. a memory map inside an `Arc` the object keeps).
pub unsafe fn readonly_view<'py, T: Element, D: Dimension>(
    owner: Bound<'py, PyAny>,
    data: &[T],
    dim: D,
) -> PyResult<Bound<'py, PyArray<T, D>>> {
    if dim.size() != data.len() {
        return Err(raise(
            Kind::Base,
            format!("view of {} elements as shape {:?}", data.len(), dim.slice()),
        ));
    }
    // SAFETY: the shape covers exactly `data`, C order, and the caller keeps `data` alive
    // through `owner`, which becomes the array's base object.
    let view = unsafe { ArrayView::from_shape_ptr(dim, data.as_ptr()) };
    let arr = unsafe { PyArray::borrow_from_array(&view, owner) };
    // The memory is shared with the dataset (and other arrays over it): never writable.
    // The flag is cleared directly rather than through `readwrite()`, whose borrow check
    // fails (a panic) while another thread holds a read-only borrow of the same memory, say
    // a split's ids handed to a loader.
    // SAFETY: `arr` was created above and is not yet shared, and the GIL is held; `flags` is
    // the object's own field (numpy's accessor, as `make_nonwriteable` uses), and clearing
    // WRITEABLE only removes a permission.
    unsafe {
        (*numpy::npyffi::_PyArray_GET_ITEM_DATA(arr.as_array_ptr())).flags &=
            !numpy::npyffi::NPY_ARRAY_WRITEABLE;
    }
    Ok(arr)
}
