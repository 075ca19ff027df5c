import os
want = {"IMG_1.jpg", "IMG_2.jpg", "Beach.png", "notes.txt", "Cat.Photo.jpg"}
got = set(os.listdir("/app/photos"))
assert got == want, got
origin = {"IMG_1.jpg": "IMG_1.JPG", "Beach.png": "Beach.PNG", "notes.txt": "notes.TXT", "Cat.Photo.jpg": "Cat.Photo.JPG", "IMG_2.jpg": "IMG_2.jpg"}
for name, was in origin.items():
    assert open(f"/app/photos/{name}").read() == f"content of {was}\n", name
