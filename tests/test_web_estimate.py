"""Issue 35 #17: "Web size about 32 MB" was a 15.6 MB zip. The estimate shown before a web-size "Download all"
is checked against the zip the real app makes of camera-like photos (picpeak_lite.media.samples) of several
sizes: within 20 %."""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

from PIL import Image

from picpeak_lite.media import samples
from picpeak_lite.services import Services
from picpeak_lite.web.views.guest import size_label

from .conftest import AuthActions
from .factories import add_photo, published


async def test_the_web_size_estimate_is_near_the_real_zip(guest: Any, admin: AuthActions,
                                                          services: Services) -> None:
    gallery = await published(admin, name="Estimate", allow_downloads=True)
    originals = 0
    for megapixels, seed in ((1.5, 1), (4, 2), (8, 3), (16, 4)):
        for name, data in samples.camera_photos(2, megapixels, seed=seed):
            photo = add_photo(services, gallery["id"], name=f"{megapixels}-{name}", data=data)
            width, height = Image.open(io.BytesIO(data)).size
            await services.db.write(lambda c, w=width, h=height, p=photo: c.execute(
                "UPDATE photos SET width = ?, height = ? WHERE id = ?", (w, h, p)))
            originals += len(data)
    page = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    shown = re.search(r"\(web size about ([\d.]+)[ \xa0](kB|MB|GB)\)", page)
    assert shown, "the gallery page shows the web size's estimate"
    zipped = await guest.get(f"/g/{gallery['slug']}/download?size=web")
    assert zipped.status_code == 200
    body = await zipped.get_data()
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert len(archive.namelist()) == 8
    estimate = float(shown.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[shown.group(2)]
    print(f"\noriginals {size_label(originals)}, web zip {len(body) / 1e6:.2f} MB, shown 'about "
          f"{shown.group(1)} {shown.group(2)}' ({estimate / len(body):.2f} of the zip)")
    assert 0.8 <= estimate / len(body) <= 1.2
